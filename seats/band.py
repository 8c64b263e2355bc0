"""The MoE row band: at or below ``band`` rows the kernel serves, above it the original expert bank.

The branch on the row count must be taken at *run* time. Written as Python in a forward, a branch on
``hidden.shape[0]`` is decided while ``torch.compile`` traces: the graph keeps the arm that was taken
and the other one is dead code (or, with guards dropped as serving engines do, never taken again).
So the branch lives inside a ``torch.library.custom_op``: opaque to the compiler, it runs eagerly on
every call, compiled or not, and its counters are true in both worlds. Prefill batches (many rows)
go to the original; decode steps (a row per sequence) to the kernel.

A custom op's schema carries tensors and scalars, not modules, so the op finds its seat through
``_SEATS``, keyed by an int baked into the graph. Entries exist only between attach and detach.
"""

from __future__ import annotations

import itertools
from typing import Any, cast

import torch

from .calls import Call
from .guards import Guard
from .hot import count, note_trace
from .seat import Seat

_SEATS: dict[int, MoeSeat] = {}
_KEYS = itertools.count(1)


@torch.library.custom_op("frt_seats::moe_band", mutates_args=())
def moe_band(hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, key: int) -> torch.Tensor:
    return _SEATS[key].run_band(hidden, top_k_index, top_k_weights)


@moe_band.register_fake
def _(hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, key: int) -> torch.Tensor:
    return torch.empty_like(hidden)


class MoeSeat(Seat):
    """An expert-bank seat: ``forward(hidden_states, top_k_index, top_k_weights)``, routing stays in the
    model. The guard runs first (dtype, device, width); the band is decided inside the op."""

    # Seat's hot path calls the kernel itself; an expert bank must go through forward (the band op).
    __call__ = torch.nn.Module.__call__
    own_class = False

    def __init__(self, original: torch.nn.Module, call: Call, guard: Guard, site: str, band: int):
        super().__init__(original, call, guard, site, "moe_experts")
        self.band = band
        self.key = next(_KEYS)

    def register(self) -> None:
        _SEATS[self.key] = self

    def unregister(self) -> None:
        _SEATS.pop(self.key, None)

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> Any:
        hot = self._hot
        if torch.compiler.is_dynamo_compiling():
            note_trace(hot)  # the band op counts the compiled calls themselves, at run time
            if hot.admits(hidden_states):
                return moe_band(hidden_states, top_k_index, top_k_weights, self.key)
            return self._original(hidden_states, top_k_index, top_k_weights)
        stats = count(hot)
        if hot.admits(hidden_states):
            return moe_band(hidden_states, top_k_index, top_k_weights, self.key)
        stats.fallbacks += 1
        return self._original(hidden_states, top_k_index, top_k_weights)

    def run_band(self, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor
        if hidden.shape[0] <= self.band:
            self.stats.band_kernel += 1
            # An expert bank returns one tensor (a fused-add norm's pair is the only tuple a call returns).
            out = cast(torch.Tensor, self._call(self._original, hidden, top_k_index, top_k_weights))
        else:
            self.stats.band_original += 1
            out = self._original(hidden, top_k_index, top_k_weights)
        # A custom op may not return one of its inputs (or a view of one).
        return out.clone() if out is hidden or out._base is not None else out

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, band={self.band}"
