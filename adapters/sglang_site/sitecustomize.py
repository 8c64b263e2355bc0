# frt-mirror: SGLang seat fallback, written by frt.adapters.sglang_engine.install (uninstall reads this line)
"""Runs at the startup of every interpreter that has this directory on ``PYTHONPATH``, the scheduler
processes SGLang spawns included (each is a fresh interpreter that inherits ``PYTHONPATH``).

It first runs the ``sitecustomize`` it shadows, the next one on ``sys.path`` (a distro's or a
virtualenv's), so putting this directory on ``PYTHONPATH`` takes nothing away. Then, only with
``FRT_SGLANG_ATTACH=1``, it asks frt to wrap ``ModelRunner.load_model`` when SGLang's model_runner is
imported. Standard library only until then: an interpreter without frt, or with the variable unset,
pays for one directory scan. It never stops an interpreter from starting: a failure is one line on stderr.
"""

import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType  # loaded already: importlib.util imports types


def _chain() -> "ModuleType | None":  # quoted: no interpreter evaluates it at start-up
    """Run the sitecustomize after this one on sys.path, as Python would have without us."""
    here = os.path.realpath(os.path.dirname(os.path.abspath(__file__)))
    dirs = [os.path.realpath(p or os.getcwd()) for p in sys.path]
    start = dirs.index(here) + 1 if here in dirs else 0
    # Skipping every copy of our own directory: PYTHONPATH may name it twice.
    rest = [p for p, d in zip(sys.path[start:], dirs[start:], strict=True) if d != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _activate() -> bool:
    if os.environ.get("FRT_SGLANG_ATTACH", "") != "1":
        return False
    try:
        from frt.adapters.sglang_engine import activate
    except ImportError as e:
        print(f"[frt.sglang] FRT_SGLANG_ATTACH=1 but frt is not importable here ({e}); seats stay off", file=sys.stderr)
        return False
    activate()
    return True


try:
    active = _activate()
except Exception as e:  # a broken frt must not cost the distro's sitecustomize or the interpreter
    print(f"[frt.sglang] seat fallback not active: {type(e).__name__}: {e}", file=sys.stderr)
    active = False
# Last, so that a failing distro sitecustomize fails the way it would have without us (site.py
# reports it) and does not take the seats with it.
chained = _chain()
