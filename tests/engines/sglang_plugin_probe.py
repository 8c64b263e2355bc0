"""The plugin door in one fresh interpreter of the SGLang venv, as at the top of a scheduler process.

    python sglang_plugin_probe.py OUT.json

Everything comes from the environment (`frt-mirror env --engine sglang`: PYTHONPATH with frt and its
dist-info, FRT_MIRROR_HOME, FRT_SEATS, SGLANG_PLUGINS), and OUT.json says what happened.

Real: sglang 0.5.23's ``ModelRunner`` class and module, its ``load_plugins()`` (entry-point discovery
through importlib.metadata over PYTHONPATH, the SGLANG_PLUGINS allow-list, HookSource) and
``HookRegistry.apply_hooks()`` with its AFTER wrapper; frt's dist-info, staged kernels and attach.
Substituted: the *body* of ``ModelRunner.load_model``. The real one builds a tensor-parallel SGLang model
on a GPU (process groups, attention backends, memory saver) and cannot run on this CPU box. The stand-in
is put on the class before ``load_plugins()``, so SGLang wraps it exactly as it would wrap the real method,
and it does to the runner what the real one does (checked against the real source below): sets
``runner.model`` to the loaded model (here a tiny transformers Qwen3) and returns None. The runner is a
real ``ModelRunner`` made with ``object.__new__``: its ``__init__`` would start loading on a GPU.
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import sys
import textwrap


def real_load_model_contract(fn) -> dict:
    """What the hook relies on, read from the real method's source: it sets self.model, returns nothing."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))

    def is_self_model(t: ast.expr) -> bool:
        return (
            isinstance(t, ast.Attribute)
            and t.attr == "model"
            and isinstance(t.value, ast.Name)
            and t.value.id == "self"
        )

    sets_model = any(isinstance(n, ast.Assign) and any(map(is_self_model, n.targets)) for n in ast.walk(tree))
    returns_value = any(isinstance(n, ast.Return) and n.value is not None for n in ast.walk(tree))
    return {"sets_self_model": sets_model, "returns_value": returns_value}


def main() -> None:
    out_path = sys.argv[1]
    from importlib.metadata import entry_points

    import sglang.srt.plugins as plugins
    from sglang.srt.model_executor import model_runner
    from sglang.srt.plugins.hook_registry import HookRegistry

    ModelRunner = model_runner.ModelRunner
    real = ModelRunner.load_model
    doc: dict = {
        "real": real_load_model_contract(real),
        "entry_points": [
            {"name": ep.name, "value": ep.value, "dist": ep.dist.name, "dir": str(ep.dist.locate_file(""))}
            for ep in entry_points(group=plugins.GENERAL_PLUGINS_GROUP)
        ],
    }

    from tests.support.seat_fixtures import tiny_qwen3

    def load_model(self):  # the stand-in (see the docstring)
        self.model = tiny_qwen3()
        # What SGLang leaves here when weights finish loading in the background (startup overlap).
        self.startup_weight_load = getattr(self, "probe_overlap", None)

    ModelRunner.load_model = load_model
    plugins.load_plugins()
    # An embedder that resets SGLang's per-process guard runs our entry point again.
    plugins._plugins_loaded = False
    plugins.load_plugins()

    from frt.adapters import sglang_engine

    hooks = HookRegistry._hooks.get(sglang_engine.TARGET, [])
    wrapped = ModelRunner.load_model
    doc["hooks"] = [
        {
            "type": t.value,
            "fn": f"{h.__module__}.{h.__qualname__}",
            "plugin": s and s.plugin_name,
            "dist": s and s.dist_name,
        }
        for t, h, s in hooks
    ]
    doc["wrapped"] = wrapped is not load_model
    doc["wraps_stand_in"] = getattr(wrapped, "__wrapped__", None) is load_model

    runner = object.__new__(ModelRunner)
    result = runner.load_model()
    reference = tiny_qwen3()  # the same seeded weights, never seated
    import torch

    ids = torch.tensor([[1, 5, 9, 42, 77, 3, 120, 8]])
    with torch.no_grad():
        got, want = runner.model(ids).logits, reference(ids).logits
    handles = sglang_engine.attached()
    doc.update(
        result=repr(result),
        handles=[
            {"line": h.line(), "seats": len(h.records), "refused": h.notes["refused"], "summary": h.summary()}
            for h in handles
        ],
        seated_modules=sorted(
            {type(m).__name__ for m in runner.model.modules()} - {type(m).__name__ for m in reference.modules()}
        ),
        rel_err=float((got - want).norm() / want.norm()),
        pid=os.getpid(),
    )
    # Loading again (a weight reload builds a new model): the hook seats the new model, once.
    runner.load_model()
    doc["handles_after_reload"] = len(sglang_engine.attached())
    overlapped = object.__new__(ModelRunner)
    overlapped.probe_overlap = object()
    overlapped.load_model()
    doc["handles_after_overlap"] = len(sglang_engine.attached())
    with open(out_path, "w") as f:
        json.dump(doc, f, indent=1, default=str)


if __name__ == "__main__":
    main()
