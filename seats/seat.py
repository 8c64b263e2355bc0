"""The module a seat installs: guard, then the kernel, else the original forward (counted).

The original module stays a registered child (``.original``), so ``model.to()``, ``parameters()``
and hooks still reach its weights, and ``detach`` puts back the very same object. ``state_dict``
keys are those of the base model (the ``original.`` step is hidden both ways), so a checkpoint
saved with seats attached loads into a model without them.

Each seat's class is its own: a subclass of Seat (same name, no state of its own) whose ``__call__``
is the hot path over this seat's state (seats.hot), made at init and again for a copy (a copy names
the shared class and makes its own). ``isinstance(x, Seat)`` holds. A seat does not pickle (its call
and trace counter are closures), now as before.

Counters, by how the call ran (none of them syncs with the device, none is inside a graph):

- ``calls`` / ``fallbacks``: eager calls; a fallback is a call the guard sent to the original.
- ``captured``: calls made while a CUDA graph was being captured (`frt.seats.capture`). The guard
  ran then, once; each replay runs the kernel it chose with no seat code, so replays are not counted.
- ``traced``: times ``torch.compile`` traced the seat into a graph. Counted at trace time (Dynamo's
  ``comptime``): an int that the traced code read would become a guard and force a recompile per
  call, so compiled calls themselves go uncounted, except the MoE band, which counts inside its
  custom op at run time.
"""

from __future__ import annotations

import copyreg
from typing import Any, SupportsIndex

import torch

from .calls import Call
from .capture import install as install_capture
from .guards import Guard
from .hot import Hot, SeatStats, count, hot_call, note_trace

__all__ = ["Seat", "SeatStats"]
_STEP = "original."
# What object.__reduce_ex__ names as the constructor of a copy; typeshed's copyreg lists only the public API.
_RECONSTRUCTORS = (copyreg.__newobj__, copyreg._reconstructor)  # type: ignore[attr-defined]


class Seat(torch.nn.Module):
    #: False where a subclass's calls must go through nn.Module.__call__ (band.MoeSeat): no class of its own
    own_class = True
    # Set through __dict__ in __init__ (no nn.Module __getattr__ on the way): declared for the type only.
    _original: torch.nn.Module
    _hot: Hot

    def __init__(self, original: torch.nn.Module, call: Call, guard: Guard, site: str, kind: str):
        super().__init__()
        self.original = original
        # Plain instance attributes: reading a registered child goes through nn.Module.__getattr__.
        self.__dict__["_original"] = original
        self.site, self.kind = site, kind
        self._call, self._guard, self._admits = call, guard, guard.admits
        self.stats = SeatStats()
        self.__dict__["_hot"] = Hot(self, original, call, guard, self.stats)
        if "cuda" in guard.devices and torch.cuda.is_available():
            install_capture()
        # torch leaves Module's hook registration (and __setstate__) unannotated, public and private alike.
        self._register_state_dict_hook(_hide_step)  # type: ignore[no-untyped-call]
        self._register_load_state_dict_pre_hook(_add_step)  # type: ignore[no-untyped-call]
        _own_class(self)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Only a seat without a class of its own comes here (one being unpickled, say): the same path.
        return hot_call(self._hot)(self, *args, **kwargs)

    def __reduce_ex__(self, protocol: SupportsIndex) -> str | tuple[Any, ...]:
        # Copied as the shared class; __setstate__ then makes the copy a class of its own,
        # over its own state (a deep copy's Hot is its own, a shallow copy's the source's, as for any attribute).
        rv = list(super().__reduce_ex__(protocol))
        if rv[0] in _RECONSTRUCTORS and rv[1] and rv[1][0] is type(self):
            rv[1] = (_shared_class(type(self)), *rv[1][1:])
        return tuple(rv)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)  # type: ignore[no-untyped-call]  # unannotated in torch (see __init__)
        if "_hot" in self.__dict__:
            _own_class(self)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        hot = self._hot
        x = args[0] if args else next(iter(kwargs.values()), None)
        if torch.compiler.is_dynamo_compiling():
            note_trace(hot)
            return hot.call(hot.original, *args, **kwargs) if hot.admits(x) else hot.original(*args, **kwargs)
        stats = count(hot)
        if hot.admits(x):
            return hot.call(hot.original, *args, **kwargs)
        stats.fallbacks += 1
        return hot.original(*args, **kwargs)

    def compile(self, *args: Any, **kwargs: Any) -> None:
        super().compile(*args, **kwargs)
        self._hot.compiled = True

    def extra_repr(self) -> str:
        return f"site={self.site!r}, kind={self.kind}, guard={self._guard.describe()!r}"


def _shared_class(cls: type[Seat]) -> type[Seat]:
    shared: type[Seat] = cls.__dict__.get("_shared_class", cls)
    return shared


def _own_class(seat: Seat) -> None:
    """Give the seat a class of its own, a subclass with no state of its own (same name, same layout),
    whose ``__call__`` is `hot.hot_call` over this seat's Hot: the hot path then reads nothing from
    the module, whose attribute reads cost ~0.1 us each (nn.Module's ``__getattr__``)."""
    shared = _shared_class(type(seat))
    if not shared.own_class:
        return
    own = type(
        shared.__name__,
        (shared,),
        {
            "__call__": hot_call(seat._hot),
            "__slots__": (),
            "__module__": shared.__module__,
            "__qualname__": shared.__qualname__,
            "_shared_class": shared,
        },
    )
    seat.__class__ = own


def _hide_step(module: torch.nn.Module, state_dict: dict[str, object], prefix: str, local_metadata: object) -> None:
    for key in [k for k in state_dict if k.startswith(prefix + _STEP)]:
        state_dict[prefix + key[len(prefix + _STEP) :]] = state_dict.pop(key)


def _add_step(
    state_dict: dict[str, object],
    prefix: str,
    local_metadata: object,
    strict: bool,
    missing_keys: list[str],
    unexpected_keys: list[str],
    error_msgs: list[str],
) -> None:
    for key in [k for k in state_dict if k.startswith(prefix) and not k.startswith(prefix + _STEP)]:
        state_dict[prefix + _STEP + key[len(prefix) :]] = state_dict.pop(key)
