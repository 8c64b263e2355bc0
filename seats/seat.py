"""The module a seat installs: guard, then the kernel, else the original forward (counted).

The original module stays a registered child (``.original``), so ``model.to()``, ``parameters()``
and hooks still reach its weights, and ``detach`` puts back the very same object. ``state_dict``
keys are those of the base model (the ``original.`` step is hidden both ways), so a checkpoint
saved with seats attached loads into a model without them.
"""

from __future__ import annotations

import torch
from torch.nn.modules.module import (_global_backward_hooks, _global_backward_pre_hooks, _global_forward_hooks,
                                     _global_forward_pre_hooks)

from .calls import Call
from .guards import Guard

_STEP = "original."
_is_compiling = torch.compiler.is_compiling
_tracing = torch._C._get_tracing_state


class SeatStats:
    """Plain counters. Under ``torch.compile`` they are not touched (an int that a graph reads would
    become a guard and force a recompile per call): compiled calls go uncounted, except the MoE band,
    which counts inside its custom op at run time."""

    __slots__ = ("calls", "fallbacks", "band_kernel", "band_original")

    def __init__(self) -> None:
        self.calls = self.fallbacks = self.band_kernel = self.band_original = 0


class Seat(torch.nn.Module):
    def __init__(self, original: torch.nn.Module, call: Call, guard: Guard, site: str, kind: str):
        super().__init__()
        self.original = original
        # Also a plain instance attribute: reading a registered child goes through
        # nn.Module.__getattr__ (~1.5 us a call here), more than the whole guard.
        self.__dict__["_original"] = original
        self.site, self.kind = site, kind
        self._call, self._guard, self._admits = call, guard, guard.admits
        self.stats = SeatStats()
        self._register_state_dict_hook(_hide_step)
        self._register_load_state_dict_pre_hook(_add_step)

    def __call__(self, *args, **kwargs):
        # The hot path, in the fewest frames: nn.Module.__call__ would cost two frames and a dozen
        # checks before forward, as much as the seat itself. It is taken only where it would do
        # more than call forward: any hook (this seat's or global), a jit trace, Module.compile() on
        # the seat, or a torch.compile trace (Dynamo inlines this method; forward then skips counting).
        if (self._compiled_call_impl is not None or _tracing() or self._forward_hooks or self._forward_pre_hooks
                or self._backward_hooks or self._backward_pre_hooks or _global_forward_hooks
                or _global_forward_pre_hooks or _global_backward_hooks or _global_backward_pre_hooks
                or _is_compiling()):
            return torch.nn.Module.__call__(self, *args, **kwargs)
        stats = self.stats
        stats.calls += 1
        if self._admits(args[0] if args else next(iter(kwargs.values()), None)):
            return self._call(self._original, *args, **kwargs)
        stats.fallbacks += 1
        return self._original(*args, **kwargs)

    def forward(self, *args, **kwargs):
        x = args[0] if args else next(iter(kwargs.values()), None)
        original = self._original
        if _is_compiling():
            return self._call(original, *args, **kwargs) if self._admits(x) else original(*args, **kwargs)
        stats = self.stats
        stats.calls += 1
        if self._admits(x):
            return self._call(original, *args, **kwargs)
        stats.fallbacks += 1
        return original(*args, **kwargs)

    def extra_repr(self) -> str:
        return f"site={self.site!r}, kind={self.kind}, guard={self._guard.describe()!r}"


def _hide_step(module, state_dict, prefix, local_metadata):
    for key in [k for k in state_dict if k.startswith(prefix + _STEP)]:
        state_dict[prefix + key[len(prefix + _STEP):]] = state_dict.pop(key)


def _add_step(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
    for key in [k for k in state_dict if k.startswith(prefix) and not k.startswith(prefix + _STEP)]:
        state_dict[prefix + _STEP + key[len(prefix):]] = state_dict.pop(key)
