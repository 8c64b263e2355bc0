"""vLLM: attach a seat catalog in every worker, after the weights load and before compile and capture.

Two doors, one hook:

- The ``vllm.general_plugins`` entry point ``frt`` → `register`. vLLM calls it in every process it
  starts (main, EngineCore, each worker, the model-inspection subprocess), spawned ones included,
  before the worker builds its model. It wraps ``BaseModelLoader.load_model`` (which the default,
  dummy, sharded-state and runai loaders inherit and both model runners call), and the wrapper
  attaches the catalog named by ``FRT_SEATS`` to the model it returns. Nothing happens when
  ``FRT_SEATS`` is unset; ``VLLM_PLUGINS`` without ``frt`` keeps vLLM from calling `register` at all.
- `install_load_hook` in the caller's own process, for scripts that build ``LLM(...)`` themselves.
  A monkeypatch reaches a worker only if the worker is this process or a fork of it, so it refuses
  when vLLM will spawn (see `spawn_reasons`) unless told ``allow_spawn=True``.

The compile cache: vLLM's cache key covers its own env vars and config, not ``FRT_SEATS`` or the kernel
commits a worker resolves, so an artifact compiled without seats (or with other kernels) would be
loaded and silently bypass them. Whenever seats are requested, `register` and `install_load_hook`
set ``VLLM_DISABLE_COMPILE_CACHE=1`` unless the user set it; a key we could compute up front (the
catalog's bytes) would still miss a re-staged kernel, and the one exact key (what attach bound) is
known only after load, when vLLM has already chosen its cache directory.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import common

if TYPE_CHECKING:
    import torch

    from frt.manifests import SeatCatalog
    from frt.resolver.errors import BadInput
    from frt.seats import Handle

ENGINE = "vllm"
COMPILE_CACHE_VAR = "VLLM_DISABLE_COMPILE_CACHE"
_MARK = "__frt_seats_hook__"
log = logging.getLogger("frt.vllm")


def _spawn_trap_class() -> type[BadInput]:
    # Built on first use: importing frt.resolver (for BadInput) costs seconds, and vLLM imports this
    # module in every process it starts, seats or not.
    global _SpawnTrap
    if _SpawnTrap is None:
        from frt.resolver.errors import BadInput

        class SpawnTrap(BadInput):
            """`install_load_hook` where vLLM will spawn its workers: the patch would not reach them."""

        SpawnTrap.__module__, SpawnTrap.__qualname__ = __name__, "SpawnTrap"
        _SpawnTrap = SpawnTrap
    return _SpawnTrap


_SpawnTrap: type[BadInput] | None = None


def __getattr__(name: str) -> type[BadInput]:
    if name == "SpawnTrap":  # vllm_engine.SpawnTrap, a BadInput
        return _spawn_trap_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _Explicit:
    """What `install_load_hook` asked for; it takes precedence over ``FRT_SEATS`` in this process."""

    def __init__(
        self,
        seats: str | Path | SeatCatalog,
        strict: bool,
        on_attached: Callable[[Handle, torch.nn.Module], None] | None,
    ):
        self.seats, self.strict, self.on_attached = seats, strict, on_attached


_explicit: _Explicit | None = None


def register() -> None:
    """The ``vllm.general_plugins`` entry point. Idempotent: vLLM guards its own loader once per process,
    but an installed frt-mirror and a PYTHONPATH dist-info, `install_load_hook`, embedders and tests
    may all reach it again."""
    if not os.environ.get(common.SEATS_VAR):
        return  # nothing asked for: not even a wrapper, so a stray install costs nothing
    _disable_compile_cache(os.environ)
    _wrap_loader()


def install_load_hook(
    seats: str | Path | SeatCatalog,
    *,
    strict: bool = False,
    on_attached: Callable[[Handle, torch.nn.Module], None] | None = None,
    allow_spawn: bool = False,
) -> None:
    """Attach ``seats`` (a catalog path or `SeatCatalog`) to every model vLLM loads in this process.

    ``on_attached(handle, model)`` runs after each attach. Raises `SpawnTrap` when vLLM will start its
    workers with spawn (they would load an unpatched vLLM), unless ``allow_spawn=True``: then the hook
    serves only models loaded in this very process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, TP 1).
    Calling it again replaces the previous request.
    """
    global _explicit
    if not allow_spawn:
        reasons = spawn_reasons()
        if reasons:
            raise _spawn_trap_class()(
                f"install_load_hook: vLLM will spawn its workers here ({'; '.join(reasons)}), and a spawned "
                "worker never sees a patch made in this process: use the 'frt' plugin with FRT_SEATS=<catalog> "
                "instead, or pass allow_spawn=True if the model loads in this process "
                "(VLLM_ENABLE_V1_MULTIPROCESSING=0)"
            )
    if not isinstance(seats, (str, Path)):
        from frt.manifests import SeatCatalog

        if not isinstance(seats, SeatCatalog):
            from frt.resolver.errors import BadInput

            raise BadInput(
                f"install_load_hook: seats must be a catalog path or a SeatCatalog, not {type(seats).__name__}"
            )
    _explicit = _Explicit(seats, strict, on_attached)
    _disable_compile_cache(os.environ)
    _wrap_loader()


def attached() -> list[Handle]:
    """The handles attached in this process so far (oldest first); empty where no model loaded here."""
    return common.handles(ENGINE)


def spawn_reasons(environ: Mapping[str, str] | None = None, argv: list[str] | None = None) -> list[str]:
    """Why vLLM would start workers with spawn in this process — vLLM's own reasons
    (``vllm.utils.system_utils._maybe_force_spawn``) plus its CPU platform, which always spawns
    unless the engine runs in-process. Read without side effects (vLLM's check rewrites the env)."""
    environ = os.environ if environ is None else environ
    argv = sys.argv if argv is None else argv
    from vllm.utils.platform_utils import cuda_is_initialized, xpu_is_initialized

    reasons = []
    if environ.get("VLLM_WORKER_MULTIPROC_METHOD") == "spawn":
        reasons.append("VLLM_WORKER_MULTIPROC_METHOD=spawn")
    if cuda_is_initialized():
        reasons.append("CUDA is already initialized in this process")
    elif xpu_is_initialized():
        reasons.append("XPU is already initialized in this process")
    if "--numa-bind" in argv:
        reasons.append("--numa-bind")
    if _in_ray_actor():
        reasons.append("this is a Ray actor")
    if _in_wsl():
        reasons.append("WSL")
    if environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "1" and _platform_is_cpu():
        reasons.append("vLLM's CPU platform spawns its engine process")
    return reasons


def _wrap_loader() -> None:
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    current = BaseModelLoader.load_model
    if getattr(current, _MARK, False):
        return
    original = current

    @functools.wraps(original)
    def load_model(self: BaseModelLoader, *args: Any, **kwargs: Any) -> torch.nn.Module:
        model: torch.nn.Module = original(self, *args, **kwargs)
        _attach(model)
        return model

    setattr(load_model, _MARK, True)
    BaseModelLoader.load_model = load_model


def _attach(model: torch.nn.Module) -> Handle | None:
    explicit = _explicit
    if explicit is None:
        return common.attach_from_env(model, ENGINE)
    from frt.manifests import load_seat_catalog
    from frt.seats import attach

    catalog = load_seat_catalog(explicit.seats) if isinstance(explicit.seats, (str, Path)) else explicit.seats
    common.ensure_log_handler()
    handle = attach(model, catalog, strict=explicit.strict, home=os.environ.get(common.HOME_VAR) or None)
    common.record(ENGINE, handle, str(catalog.path or "<catalog>"))
    if explicit.on_attached is not None:
        explicit.on_attached(handle, model)
    return handle


def _disable_compile_cache(environ: MutableMapping[str, str]) -> None:
    value = environ.get(COMPILE_CACHE_VAR)
    if value is None:
        environ[COMPILE_CACHE_VAR] = "1"
    elif value.strip() not in ("1", "true", "True"):
        log.warning(
            "[frt.vllm] %s=%s: a compiled artifact cached without these seats would be reused "
            "and bypass them; set it to 1 while seats are attached",
            COMPILE_CACHE_VAR,
            value,
        )


def _in_ray_actor() -> bool:
    try:
        from vllm.ray.lazy_utils import is_in_ray_actor
    except ImportError:
        return False
    return bool(is_in_ray_actor())


def _in_wsl() -> bool:
    from vllm.platforms.interface import in_wsl

    return bool(in_wsl())


def _platform_is_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())
