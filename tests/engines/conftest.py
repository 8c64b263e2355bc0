"""Engine tests: real engines in their own venvs (tests/engines/venv_<engine>.sh), never in the main suite.

Each engine's tests (``test_<engine>_*.py``) are collected only where that engine is importable, or
when FRT_ENGINE_TESTS names it (``vllm``, ``sglang``, or ``1`` for all). The main suite's plain
``pytest`` in .venv (no engine: their torch and transformers pins differ) therefore does not collect
this folder at all. That is a deliberate exclusion, not a skip: an engine step runs its tests with
its own venv's python and FRT_ENGINE_TESTS set, where the test module imports the engine at the top,
so a venv without it fails loudly (and pytest's exit 5, "no tests collected", fails CI as well).
"""

from __future__ import annotations

import importlib.util
import os

import pytest

ENGINES = {"vllm": "vllm", "sglang": "sglang"}  # test file prefix: the module that must import


def _collected(engine: str) -> bool:
    wanted = {w.strip() for w in os.environ.get("FRT_ENGINE_TESTS", "").split(",") if w.strip()}
    return bool(wanted & {"1", engine}) or importlib.util.find_spec(ENGINES[engine]) is not None


collect_ignore_glob = [f"test_{e}_*.py" for e in ENGINES if not _collected(e)]


@pytest.fixture(scope="session")
def engine(tmp_path_factory):
    """The vLLM job (vllm_helpers.Engine), shared by every vLLM test of the session."""
    from tests.engines.vllm_helpers import Engine

    e = Engine(tmp_path_factory.mktemp("vllm"))
    yield e
    e.pool.shutdown(wait=True, cancel_futures=True)
