"""Checks of the vLLM adapter that need vLLM imported but no engine, in a fresh process each.

    python vllm_probe.py OUT.json trap|idempotent

trap: `install_load_hook` refuses where vLLM will spawn (its CPU platform with the multiprocess
engine; VLLM_WORKER_MULTIPROC_METHOD=spawn; --numa-bind), and installs with allow_spawn=True.
idempotent: `register` repeated, then vLLM's own plugin loading (which finds the entry point in the
PYTHONPATH dist-info), wraps ``BaseModelLoader.load_model`` exactly once.
"""

from __future__ import annotations

import json
import os
import sys


def wrapper_depth() -> int:
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    fn, depth = BaseModelLoader.load_model, 0
    while getattr(fn, "__frt_seats_hook__", False):
        depth, fn = depth + 1, fn.__wrapped__
    return depth


def trap() -> dict:
    from frt.adapters import vllm_engine

    out: dict = {}
    for name, env in (
        ("cpu_multiprocess", {}),
        ("spawn_method", {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}),
    ):
        os.environ.update(env)
        try:
            vllm_engine.install_load_hook(os.environ["FRT_SEATS"])
            out[name] = "installed"
        except vllm_engine.SpawnTrap as e:
            out[name] = str(e)
        out[name + "_depth"] = wrapper_depth()
    out["numa_reasons"] = vllm_engine.spawn_reasons({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, ["serve", "--numa-bind"])
    out["in_process_reasons"] = vllm_engine.spawn_reasons({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, [])
    vllm_engine.install_load_hook(os.environ["FRT_SEATS"], allow_spawn=True)
    out["allow_spawn_depth"] = wrapper_depth()
    return out


def idempotent() -> dict:
    from importlib.metadata import entry_points

    from frt.adapters import vllm_engine

    eps = [f"{e.name}={e.value}" for e in entry_points(group="vllm.general_plugins")]
    seats = os.environ.pop("FRT_SEATS")
    vllm_engine.register()
    out: dict = {"entry_points": eps, "depth_unset": wrapper_depth()}
    os.environ["FRT_SEATS"] = seats
    for _ in range(3):
        vllm_engine.register()
    out["depth_after_3"] = wrapper_depth()
    import vllm.plugins

    vllm.plugins.load_general_plugins()  # vLLM's own loader: the entry point, from PYTHONPATH
    out["depth_after_vllm"] = wrapper_depth()
    out["compile_cache"] = os.environ.get("VLLM_DISABLE_COMPILE_CACHE")
    return out


if __name__ == "__main__":
    result = {"trap": trap, "idempotent": idempotent}[sys.argv[2]]()
    with open(sys.argv[1], "w") as f:
        json.dump(result, f)
