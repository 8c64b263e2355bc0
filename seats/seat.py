"""The module a seat installs: guard, then the kernel, else the original forward (counted).

The original module stays a registered child (``.original``), so ``model.to()``, ``parameters()``
and hooks still reach its weights, and ``detach`` puts back the very same object. ``state_dict``
keys are those of the base model (the ``original.`` step is hidden both ways), so a checkpoint
saved with seats attached loads into a model without them.

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

import copy

import torch
from torch.nn.modules.module import (_global_backward_hooks, _global_backward_pre_hooks, _global_forward_hooks,
                                     _global_forward_pre_hooks)

from . import capture
from .calls import Call
from .guards import Guard

_STEP = "original."
_dynamo = torch.compiler.is_dynamo_compiling  # one frame; torch.compiler.is_compiling() takes three
_UNDERWAY = capture.UNDERWAY
_UNSET = object()


class SeatStats:
    __slots__ = ("calls", "fallbacks", "captured", "traced", "band_kernel", "band_original")

    def __init__(self) -> None:
        self.calls = self.fallbacks = self.captured = self.traced = self.band_kernel = self.band_original = 0


class _Hot:
    """What a seat's hot path reads, in slots. A Seat is an nn.Module, whose ``__getattr__`` keeps
    CPython from specialising attribute reads on it: each ``self.x`` cost ~0.1 us, a dozen per call.
    The hook dicts are the module's own objects (hooks are added to them in place), so reading them
    here sees every registration."""

    __slots__ = ("call", "check", "admits", "original", "stats", "fwd", "fwd_pre", "bwd", "bwd_pre",
                 "compiled", "cuda", "on_trace")

    def __init__(self, seat: Seat, original: torch.nn.Module, call: Call, guard: Guard, stats: SeatStats):
        self.call, self.check, self.admits, self.original, self.stats = call, guard.check, guard.admits, original, stats
        self.fwd, self.fwd_pre = seat._forward_hooks, seat._forward_pre_hooks
        self.bwd, self.bwd_pre = seat._backward_hooks, seat._backward_pre_hooks
        self.compiled = False  # Module.compile() on the seat: calls must go through nn.Module.__call__
        self.cuda = "cuda" in guard.devices
        self.on_trace = _trace_counter(stats)

    def __deepcopy__(self, memo):
        # A deep-copied seat (its module dicts and stats copied through memo) gets its own trace
        # counter: a function is copied by reference, so the old one would count for the source seat.
        new = _Hot.__new__(_Hot)
        for name in _Hot.__slots__:
            if name != "on_trace":
                setattr(new, name, copy.deepcopy(getattr(self, name), memo))
        new.on_trace = _trace_counter(new.stats)
        return new


def _trace_counter(stats: SeatStats):
    """A plain function for Dynamo's comptime: it runs it at trace time, and only then."""
    def on_trace(ctx) -> None:
        stats.traced += 1

    return on_trace


def _note_trace(hot: _Hot) -> None:
    from torch._dynamo.comptime import comptime  # only reached while Dynamo traces: already imported

    comptime(hot.on_trace)


def _count(hot: _Hot) -> SeatStats:
    stats = hot.stats
    if _UNDERWAY[0] and hot.cuda and capture.stream_capturing():
        stats.captured += 1
    else:
        stats.calls += 1
    return stats


class Seat(torch.nn.Module):
    def __init__(self, original: torch.nn.Module, call: Call, guard: Guard, site: str, kind: str):
        super().__init__()
        self.original = original
        # Plain instance attributes: reading a registered child goes through nn.Module.__getattr__.
        self.__dict__["_original"] = original
        self.site, self.kind = site, kind
        self._call, self._guard, self._admits = call, guard, guard.admits
        self.stats = SeatStats()
        self.__dict__["_hot"] = _Hot(self, original, call, guard, self.stats)
        if "cuda" in guard.devices and torch.cuda.is_available():
            capture.install()
        self._register_state_dict_hook(_hide_step)
        self._register_load_state_dict_pre_hook(_add_step)

    def __call__(self, x=_UNSET, *args, **kwargs):
        # The hot path: one positional argument, no hook, not traced. nn.Module.__call__ would cost
        # two frames and a dozen checks before forward, as much as the seat itself; it is taken only
        # where it would do more than call forward: a hook (this seat's or a global one),
        # Module.compile() on the seat, or a torch.compile trace (Dynamo inlines it; forward then
        # counts the trace, not the call). A torch.jit.trace records the kernel's ops through here.
        hot = self._hot
        if (_dynamo() or hot.compiled or hot.fwd or hot.fwd_pre or hot.bwd or hot.bwd_pre or _global_forward_hooks
                or _global_forward_pre_hooks or _global_backward_hooks or _global_backward_pre_hooks):
            return torch.nn.Module.__call__(self, *_join(x, args), **kwargs)
        if args or kwargs or x is _UNSET:
            return self.forward(*_join(x, args), **kwargs)
        # Guard and counters stay outside any CUDA graph: during a capture this Python runs once (counted
        # as captured) and the graph records only the kernel it chose; replays run no seat code.
        stats = hot.stats
        if _UNDERWAY[0] and hot.cuda and capture.stream_capturing():  # one global read unless capturing
            stats.captured += 1
        else:
            stats.calls += 1
        try:
            ok = hot.check(x)
        except (AttributeError, IndexError):  # not a tensor, or a 0-d one: not the kernel's
            ok = False
        if ok:
            return hot.call(hot.original, x)
        stats.fallbacks += 1
        return hot.original(x)

    def forward(self, *args, **kwargs):
        hot = self._hot
        x = args[0] if args else next(iter(kwargs.values()), None)
        if _dynamo():
            _note_trace(hot)
            return hot.call(hot.original, *args, **kwargs) if hot.admits(x) else hot.original(*args, **kwargs)
        stats = _count(hot)
        if hot.admits(x):
            return hot.call(hot.original, *args, **kwargs)
        stats.fallbacks += 1
        return hot.original(*args, **kwargs)

    def compile(self, *args, **kwargs) -> None:
        super().compile(*args, **kwargs)
        self._hot.compiled = True

    def extra_repr(self) -> str:
        return f"site={self.site!r}, kind={self.kind}, guard={self._guard.describe()!r}"


def _join(x, args: tuple) -> tuple:
    return args if x is _UNSET else (x, *args)


def _hide_step(module, state_dict, prefix, local_metadata):
    for key in [k for k in state_dict if k.startswith(prefix + _STEP)]:
        state_dict[prefix + key[len(prefix + _STEP):]] = state_dict.pop(key)


def _add_step(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
    for key in [k for k in state_dict if k.startswith(prefix) and not k.startswith(prefix + _STEP)]:
        state_dict[prefix + _STEP + key[len(prefix):]] = state_dict.pop(key)
