"""A tiny real transformers model as a fake-Hub model repo.

The model is written by transformers itself (save_pretrained, safetensors) in the main venv, in a
subprocess: the huggingface_hub 1.33 venv has neither torch nor transformers, and its tests still need
the same repo to stage and serve."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.support import ROOT
from tests.support.fakehub import FakeRepo

TINY_MODEL = "acme/tiny-qwen"
INCLUDE = ["*.safetensors", "*.json"]
EXCLUDE = ["vocab.json"]
# Beside what transformers writes: one file the include patterns leave out, one the exclude takes out.
EXTRA = {"README.md": b"# tiny-qwen\n", "vocab.json": b'{"a": 0}\n'}

_WRITE = """
import json, sys, torch
from transformers import Qwen2Config, Qwen2ForCausalLM
torch.manual_seed(0)
cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
model = Qwen2ForCausalLM(cfg).eval()
model.save_pretrained(sys.argv[1], safe_serialization=True)
with torch.no_grad():
    logits = model(torch.tensor([[1, 2, 3, 4]])).logits
print(json.dumps({"logits_sum": float(logits.sum()), "params": sum(p.numel() for p in model.parameters())}))
"""


# The tiny model through transformers (run_client code: `report` is run_client's; .format(repo=...)).
LOAD = """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.from_pretrained({repo!r})
    model = AutoModelForCausalLM.from_pretrained({repo!r}).eval()
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3, 4]])).logits
    report({{"type": cfg.model_type, "layers": cfg.num_hidden_layers, "logits_sum": float(logits.sum()),
             "params": sum(p.numel() for p in model.parameters())}})
"""


def write_tiny_model(out: Path) -> dict:
    """Save the model under `out`; return what a load of it must reproduce (logits of a fixed input)."""
    p = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "python"), "-c", _WRITE, str(out)], capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def tiny_model_repo(src: Path) -> FakeRepo:
    repo = FakeRepo(TINY_MODEL, repo_type="model")
    files = {p.name: p.read_bytes() for p in sorted(src.iterdir()) if p.is_file()}
    repo.commit({**files, **EXTRA}, title="tiny qwen2, 2 layers")
    return repo


def selected(repo: FakeRepo) -> list[str]:
    """The files the manifest's patterns select, by name (what stage must fetch, exactly)."""
    files = repo.commits[repo.branches["main"]].files
    return sorted(p for p in files if p.endswith((".safetensors", ".json")) and p not in EXCLUDE)
