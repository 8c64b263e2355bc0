"""A seat's hot path: what one eager call runs before its kernel, and the state it reads.

A seat's cost is this Python on every eager call of a site whose kernel may take ~30 us in all (a
Triton launch), measured against that kernel called directly (bench/seats.py). On the H200's host
(CPython 3.12, a kernel that returns its input) it is ~0.41 us, where it was ~0.62: the guard ~0.20
(one C call: guards.tensor_match), the hook and Dynamo checks ~0.12, the counter ~0.04, calling a
module at all (CPython's slot call of a Python ``__call__``) ~0.04. Two costs are gone: reading
``self._hot`` on an nn.Module (its ``__getattr__`` keeps CPython from specialising attribute reads
on it) and the guard's three tensor attributes read from Python. Each seat has a class of its own
whose ``__call__`` closes over the seat's `Hot` (`hot_call`; seat.Seat makes the class), so nothing
is read from the module on the way to the kernel. Those are tight-loop figures; beside a real launch
every part costs three to ten times as much (its code and objects out of the caches; +1.8 to +3.6 us
in all on that host, call by call): bench/seat_cost.py measures each part there.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.modules.module import (
    _global_backward_hooks,
    _global_backward_pre_hooks,
    _global_forward_hooks,
    _global_forward_pre_hooks,
)

from .calls import Call
from .capture import UNDERWAY as _UNDERWAY
from .capture import stream_capturing
from .guards import Guard, tensor_match

_dynamo = torch.compiler.is_dynamo_compiling  # one frame; torch.compiler.is_compiling() takes three
UNSET = object()
_REMATCH = 4  # times a seat may re-specialise its fast match (a change of grad mode, say), then it keeps it


class SeatStats:
    __slots__ = ("calls", "fallbacks", "captured", "traced", "band_kernel", "band_original")

    def __init__(self) -> None:
        self.calls = self.fallbacks = self.captured = self.traced = self.band_kernel = self.band_original = 0


class Hot:
    """What a seat's hot path reads, in slots. The hook dicts are the module's own objects (hooks are
    added to them in place), so reading them here sees every registration."""

    __slots__ = (
        "call",
        "guard",
        "fast",
        "rematches",
        "admits",
        "original",
        "stats",
        "fwd",
        "fwd_pre",
        "bwd",
        "bwd_pre",
        "compiled",
        "cuda",
        "on_trace",
    )

    def __init__(self, seat: torch.nn.Module, original: torch.nn.Module, call: Call, guard: Guard, stats: SeatStats):
        self.call, self.guard, self.admits, self.original, self.stats = call, guard, guard.admits, original, stats
        # The first test of every eager call, set by `admit` from the first admitted tensor: a match
        # specialised on it (guards.tensor_match), else the guard's own check. What it misses, `admit` decides.
        self.fast: Callable[[object], bool] = _unmatched
        self.rematches = 0
        self.fwd, self.fwd_pre = seat._forward_hooks, seat._forward_pre_hooks
        self.bwd, self.bwd_pre = seat._backward_hooks, seat._backward_pre_hooks
        self.compiled = False  # Module.compile() on the seat: calls must go through nn.Module.__call__
        self.cuda = "cuda" in guard.devices
        self.on_trace = _trace_counter(stats)

    def __deepcopy__(self, memo: dict[int, object]) -> Hot:
        # A deep-copied seat (its module dicts and stats copied through memo) gets its own trace
        # counter: a function is copied by reference, so the old one would count for the source seat.
        # The fast match (a C object, not copyable) is rebuilt by the copy's own first calls.
        new = Hot.__new__(Hot)
        for name in Hot.__slots__:
            if name not in ("on_trace", "fast", "rematches"):
                setattr(new, name, copy.deepcopy(getattr(self, name), memo))
        new.on_trace = _trace_counter(new.stats)
        new.fast, new.rematches = _unmatched, 0
        return new


def hot_call(hot: Hot) -> Callable[..., Any]:
    """The ``__call__`` of one seat's own class. The hot path: one positional argument, no hook, not
    traced. nn.Module.__call__ would cost two frames and a dozen checks before forward, as much as the
    seat itself; it is taken only where it would do more than call forward: a hook (this seat's or a
    global one), Module.compile() on the seat, or a torch.compile trace (Dynamo inlines this; forward
    then counts the trace, not the call). A torch.jit.trace records the kernel's ops through here.

    Guard and counters stay outside any CUDA graph: during a capture this Python runs once (counted as
    captured) and the graph records only the kernel it chose; replays run no seat code."""
    call, original, stats, cuda = hot.call, hot.original, hot.stats, hot.cuda
    fwd, fwd_pre, bwd, bwd_pre = hot.fwd, hot.fwd_pre, hot.bwd, hot.bwd_pre

    # Any: what the original module's forward returns, which nothing here narrows.
    def __call__(self: torch.nn.Module, x: object = UNSET, *args: object, **kwargs: object) -> Any:
        if (
            _dynamo()
            or hot.compiled
            or fwd
            or fwd_pre
            or bwd
            or bwd_pre
            or _global_forward_hooks
            or _global_forward_pre_hooks
            or _global_backward_hooks
            or _global_backward_pre_hooks
        ):
            return torch.nn.Module.__call__(self, *join(x, args), **kwargs)
        if args or kwargs or x is UNSET:
            return self.forward(*join(x, args), **kwargs)
        if _UNDERWAY[0] and cuda and stream_capturing():  # one global read unless capturing
            stats.captured += 1
        else:
            stats.calls += 1
        try:
            ok = hot.fast(x)
        except (AttributeError, IndexError):  # the Python check on what is not a tensor, or a 0-d one
            ok = False
        if ok or admit(hot, x):
            return call(original, x)
        stats.fallbacks += 1
        return original(x)

    return __call__


def join(x: object, args: tuple[object, ...]) -> tuple[object, ...]:
    return args if x is UNSET else (x, *args)


def admit(hot: Hot, x: object) -> bool:
    """The guard's verdict on a call its fast match missed. An admitted tensor becomes the fast match's
    example, a few times at most: two kinds of call that alternate would otherwise rebuild it on
    every call (each then pays the fast miss and this, ~0.3 us more than a hit)."""
    if not hot.admits(x):
        return False
    if hot.rematches < _REMATCH:
        hot.rematches += 1
        hot.fast = tensor_match(hot.guard, x) or hot.guard.check
    return True


def _unmatched(x: object) -> bool:
    return False


def _trace_counter(stats: SeatStats) -> Callable[[object], None]:
    """A plain function for Dynamo's comptime: it runs it at trace time, and only then."""

    def on_trace(ctx: object) -> None:
        stats.traced += 1

    return on_trace


def note_trace(hot: Hot) -> None:
    from torch._dynamo.comptime import comptime  # only reached while Dynamo traces: already imported

    comptime(hot.on_trace)


def count(hot: Hot) -> SeatStats:
    stats = hot.stats
    if _UNDERWAY[0] and hot.cuda and stream_capturing():
        stats.captured += 1
    else:
        stats.calls += 1
    return stats
