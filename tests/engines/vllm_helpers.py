"""The vLLM engine tests' job: a staged home, the PYTHONPATH route, a tiny model, and a pool of runs.

The pytest process itself never imports frt: pytest puts the repository root on sys.path, where
``frt/`` holds only the namespace's ``__init__``. frt reaches every run the way it reaches a
read-only cluster: ``frt-mirror env --engine vllm`` writes a directory with the frt package and the
plugin's dist-info, and the runs get its PYTHONPATH, FRT_MIRROR_HOME, FRT_SEATS and VLLM_PLUGINS.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from tests.engines.engine_job import HERE, ROOT, prepare


def write_tiny_llama(path: Path) -> Path:
    """A 2-layer Llama with seeded random weights at a realistic scale (norms near 1), saved as a
    checkpoint. vLLM's load_format="dummy" fills every weight, norms included, with U(-1e-3, 1e-3):
    the next-token distribution is then uniform (every logprob is -ln(vocab)), so greedy agreement
    would prove nothing. The dummy loader still runs once (the no-op test)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.support.seat_fixtures import randomize

    cfg = LlamaConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,  # vLLM CPU: head_dim 64
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    model = randomize(LlamaForCausalLM(cfg))
    model.save_pretrained(path)
    return path


class Engine:
    """The staged home, the PYTHONPATH route, the model, and a small pool that runs vLLM subprocesses
    (two at a time: most of a run is single-threaded imports)."""

    def __init__(self, root: Path):
        from tests.support.seat_fixtures import ACTIVATION, RMSNORM

        self.root = root
        self.catalog = ROOT / "manifests" / "examples" / "seats-vllm.toml"
        self.prepared = prepare(root, "vllm", (ACTIVATION, RMSNORM), self.catalog)
        self.home, self.env_doc = self.prepared.home, self.prepared.env_doc
        self.model = write_tiny_llama(root / "model")
        self.pool = ThreadPoolExecutor(max_workers=int(os.environ.get("FRT_ENGINE_JOBS", "2")))
        self.runs: dict[str, Future] = {}

    def env(self, **overrides: str | None) -> dict[str, str]:
        """What `frt-mirror env --engine vllm` printed, with per-run overrides (None removes a key)."""
        # Offline: the model is a local folder and the kernels come from the home; a 1 GiB KV cache
        # (vLLM's CPU default takes a share of RAM) and one thread each, two runs side by side.
        return self.prepared.env(overrides, HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1", OMP_NUM_THREADS="1")

    def submit(
        self, name: str, args: list[str], env: dict[str, str], script: str = "vllm_run.py", timeout: float = 420
    ) -> None:
        if name not in self.runs:
            self.runs[name] = self.pool.submit(self._run, name, args, env, script, timeout)

    def result(self, name: str) -> Run:
        return self.runs[name].result()

    def _run(self, name: str, args: list[str], env: dict[str, str], script: str, timeout: float) -> Run:
        import time

        out = self.root / f"{name}.json"
        markers = self.root / f"markers-{name}"
        # One stream, unbuffered: vLLM logs to stdout, frt to stderr, and the tests read their order.
        env = {**env, "FRT_SEATS_MARKER_DIR": str(markers), "PYTHONUNBUFFERED": "1"}
        t0 = time.perf_counter()
        p = subprocess.run(
            [sys.executable, str(HERE / script), str(out), *args],
            cwd=self.root,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            timeout=timeout,
        )
        seconds = time.perf_counter() - t0
        (self.root / f"{name}.log").write_text(p.stdout)  # kept for whoever reads a failure
        assert p.returncode == 0 and out.exists(), f"{name} failed (rc {p.returncode}):\n{p.stdout[-8000:]}"
        found = {f.name: json.loads(f.read_text()) for f in markers.glob("vllm-*.json")} if markers.exists() else {}
        return Run(name, json.loads(out.read_text()), p.stdout, found, seconds)


class Run:
    def __init__(self, name: str, doc: dict, log: str, markers: dict[str, dict], seconds: float):
        self.name, self.doc, self.log, self.markers, self.seconds = name, doc, log, markers, seconds

    def __repr__(self) -> str:
        return f"<Run {self.name} {self.seconds:.1f}s>"
