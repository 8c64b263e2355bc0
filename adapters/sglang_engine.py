"""SGLang: attach a seat catalog in every scheduler process, after the weights load and before graph capture.

The model lives in SGLang's scheduler processes (Scheduler → TpModelWorker → ``ModelRunner``), which
SGLang starts with ``spawn``: a patch made in the launching process never reaches them. Two doors
reach them, and both end in `after_load_model`, which attaches the catalog named by ``FRT_SEATS`` to
``runner.model`` (``ModelRunner.load_model`` sets it and returns None):

- The ``sglang.srt.plugins`` entry point ``frt`` → `register` (SGLang 0.5.23+). SGLang's
  ``load_plugins()`` runs it at the top of every scheduler process; `register` adds an AFTER hook on
  ``ModelRunner.load_model`` to SGLang's ``HookRegistry``, which ``load_plugins()`` then applies.
  ``SGLANG_PLUGINS`` without ``frt`` keeps SGLang from calling it at all. The entry point works
  installed or from a dist-info on ``PYTHONPATH`` (`frt.adapters.distinfo`).
- The sitecustomize fallback, for SGLang without ``sglang.srt.plugins``: `install` writes a
  ``sitecustomize.py`` into a directory that goes first on ``PYTHONPATH``. Every interpreter, spawned
  schedulers included, runs it at startup; it runs the sitecustomize it shadows (a distro's), and
  only with ``FRT_SGLANG_ATTACH=1`` calls `activate`, which wraps ``ModelRunner.load_model`` the moment
  SGLang's model_runner module is imported. `uninstall` removes what `install` wrote.

``load_model`` runs before CUDA graph capture and ``torch.compile`` (both come later, in the Scheduler),
so the seats are what gets captured. Draft models (speculative decoding) have their own ModelRunner
and get the same catalog; sites that do not match are recorded as unmatched, not refused.
"""

from __future__ import annotations

import functools
import os
import sys
import weakref
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from frt.resolver.fs import atomic_write

if TYPE_CHECKING:
    from importlib.abc import Loader
    from importlib.machinery import ModuleSpec
    from pathlib import Path

    import torch

    from frt.seats import Handle

ENGINE = "sglang"
MODULE = "sglang.srt.model_executor.model_runner"
TARGET = f"{MODULE}.ModelRunner.load_model"
ATTACH_VAR = "FRT_SGLANG_ATTACH"
# With FRT_SGLANG_ATTACH=1 every interpreter of the job imports this module at startup: the top level
# stays on what Python has loaded by then anyway (no pathlib, importlib.abc or logging:
# together ~60 ms per process).
SITE_TEMPLATE = os.path.join(os.path.dirname(__file__), "sglang_site", "sitecustomize.py")
_MARK = "__frt_sglang_hook__"

# Models seated in this process. Both doors may wrap load_model in one process (the entry point and
# FRT_SGLANG_ATTACH=1); the second hook to run must not seat the same model twice.
_seated: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()


# --- the plugin door ---------------------------------------------------------------------------------


def register() -> None:
    """The ``sglang.srt.plugins`` entry point. Idempotent: a process may run ``load_plugins()`` more
    than once (SGLang guards it per process, but tests and embedders reset that guard)."""
    from . import common

    if not os.environ.get(common.SEATS_VAR):
        return  # nothing asked for: not even a hook, so a stray dist-info costs nothing
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    # HookRegistry has no lookup API; its table is the one truth about what apply_hooks will wrap.
    if any(hook is after_load_model for _, hook, _ in HookRegistry._hooks.get(TARGET, ())):
        return
    HookRegistry.register(TARGET, after_load_model, HookType.AFTER)


def after_load_model(result: Any, runner: Any, *args: Any, **kwargs: Any) -> None:
    """The AFTER hook on ``ModelRunner.load_model`` (signature ``fn(result, *args, **kwargs)``; args[0]
    is the runner). Returns None, so load_model's own result passes through unchanged."""
    attach_to_runner(runner)


def attach_to_runner(runner: Any) -> Handle | None:
    """Attach ``FRT_SEATS`` to ``runner.model``; None when nothing was attached (and why, logged)."""
    from . import common

    if not os.environ.get(common.SEATS_VAR):
        return None
    model = getattr(runner, "model", None)
    if model is None:
        _not_attached(f"{type(runner).__name__} has no model after load_model")
        return None
    if model in _seated:
        return None
    # With startup weight-load overlap, load_model returns placeholder weights that are committed
    # only after graph capture: parity would judge placeholders, and capture would freeze the
    # originals. Refuse loudly rather than seat something unverified.
    if getattr(runner, "startup_weight_load", None) is not None:
        _not_attached(
            "weights load in the background (startup weight-load overlap) and are "
            "committed after graph capture; start SGLang without that overlap"
        )
        return None
    handle = common.attach_from_env(model, ENGINE)
    if handle is not None:
        _seated.add(model)
    return handle


def _not_attached(reason: str) -> None:
    """Seats were asked for and none can be attached: an error under FRT_SEATS_STRICT, else a warning."""
    import logging

    from frt.resolver.errors import BadInput

    from . import common

    if common.strict_from_env(os.environ):
        raise BadInput(f"[frt.sglang] seats not attached ({common.STRICT_VAR} is on): {reason}")
    common.ensure_log_handler()
    logging.getLogger("frt.sglang").warning("[frt.sglang] seats not attached: %s", reason)


def attached() -> list[Handle]:
    """The handles attached in this process so far (oldest first)."""
    from . import common

    return common.handles(ENGINE)


# --- the sitecustomize door --------------------------------------------------------------------------


def wrap_load_model(cls: type[Any]) -> bool:
    """Wrap ``cls.load_model`` with `after_load_model`; False when a wrapper of ours is already on it
    (anywhere in its ``__wrapped__`` chain, e.g. under SGLang's own hook wrapper)."""
    current = cls.__dict__.get("load_model")
    if current is None:
        raise TypeError(f"{cls.__qualname__} defines no load_model: this SGLang is not one frt knows")
    fn = current
    while fn is not None:
        if getattr(fn, _MARK, False):
            return False
        fn = getattr(fn, "__wrapped__", None)

    @functools.wraps(current)
    def load_model(self: Any, *args: Any, **kwargs: Any) -> Any:  # SGLang's ModelRunner: untyped here
        result = current(self, *args, **kwargs)
        after_load_model(result, self, *args, **kwargs)
        return result

    setattr(load_model, _MARK, True)
    cls.load_model = load_model
    return True


class _PatchOnImport:  # a sys.meta_path finder (duck-typed: see SITE_TEMPLATE on why no ABC)
    """Runs ``patch(module)`` right after ``name`` is executed, whenever it is first imported: importing
    SGLang eagerly at interpreter startup would cost every Python process seconds, SGLang or not."""

    def __init__(self, name: str, patch: Callable[[ModuleType], None]):
        self.name, self.patch = name, patch

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != self.name:
            return None
        # Whoever would have found it without us (the path finder, an editable install's finder).
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None) if finder is not self else None
            spec: ModuleSpec | None = find(fullname, path, target) if find is not None else None
            if spec is not None and spec.loader is not None:
                # The stub wants an importlib.abc.Loader; importlib itself takes any object with its two
                # methods, and importing importlib.abc would cost every interpreter start (SITE_TEMPLATE).
                spec.loader = _PatchingLoader(spec.loader, self.patch)  # type: ignore[assignment]
                return spec
        return None


class _PatchingLoader:
    def __init__(self, loader: Loader, patch: Callable[[ModuleType], None]):
        self.loader, self.patch = loader, patch

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        self.patch(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_code, …: what tracebacks and inspect ask for
        return getattr(self.loader, name)


def _patch_model_runner(module: ModuleType) -> None:
    wrap_load_model(module.ModelRunner)


def activate() -> None:
    """Wrap ``ModelRunner.load_model`` now if SGLang's model_runner is imported, else when it is.
    Idempotent. What the installed sitecustomize calls under ``FRT_SGLANG_ATTACH=1``."""
    module = sys.modules.get(MODULE)
    if module is not None:
        _patch_model_runner(module)
        return
    if not any(isinstance(f, _PatchOnImport) and f.name == MODULE for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport(MODULE, _patch_model_runner))


def install(directory: str | Path) -> Path:
    """Write the fallback ``sitecustomize.py`` into ``directory`` (created if missing) and return its path.

    Put ``directory`` first on the engine's ``PYTHONPATH`` (frt itself must be importable there too)
    and set ``FRT_SGLANG_ATTACH=1`` and ``FRT_SEATS``. Use a directory of its own: a later
    `frt.adapters.distinfo.write_python_dir` replaces its directory whole. Idempotent; refuses to
    overwrite a sitecustomize.py that is not ours.
    """
    from pathlib import Path

    from frt.resolver.errors import BadInput

    target = Path(directory) / "sitecustomize.py"
    template = Path(SITE_TEMPLATE)
    if not template.is_file():
        raise BadInput(f"{template} is missing: this frt was packaged without adapters/sglang_site")
    text = template.read_bytes()
    if target.exists():
        if target.read_bytes() == text:
            return target
        if not _is_ours(target):
            raise BadInput(f"{target} exists and is not frt's: not overwriting it (use another directory)")
    return atomic_write(target, text)


def uninstall(directory: str | Path) -> list[Path]:
    """Remove what `install` wrote into ``directory`` (and the bytecode Python cached for it), then the
    directory itself if that left it empty. Returns what was removed; a foreign sitecustomize stays."""
    from pathlib import Path

    directory = Path(directory)
    target = directory / "sitecustomize.py"
    removed: list[Path] = []
    if target.exists() and _is_ours(target):
        target.unlink()
        removed.append(target)
    cache = directory / "__pycache__"
    for pyc in sorted(cache.glob("sitecustomize.*.pyc")) if removed else ():
        pyc.unlink()
        removed.append(pyc)
    for d in (cache, directory) if removed else ():
        if d.is_dir() and not any(d.iterdir()):
            d.rmdir()
            removed.append(d)
    return removed


def _is_ours(path: Path) -> bool:
    """Our template, possibly of another frt version: recognised by its first line."""
    with open(path, "rb") as f:
        first = f.readline()
    with open(SITE_TEMPLATE, "rb") as f:
        return first == f.readline()
