"""frt.adapters — vLLM and SGLang adapters for seats. Not built yet (issue: Engine adapters)."""
