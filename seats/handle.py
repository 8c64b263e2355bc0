"""What attach returns: the seats in place, the refusals, live counters, and the way back out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

import torch

from .band import MoeSeat
from .parity import Parity
from .seat import Seat


@dataclass(frozen=True)
class SeatRecord:
    site: str
    kind: str
    kernel: str  # "org/name v1 layers.RMSNorm"
    commit: str
    variant: str
    parent: torch.nn.Module
    attr: str
    original: torch.nn.Module
    seat: Seat
    parity: Parity | None  # None when the catalog turned parity off
    slabs: int = 0  # lm_head: the number of row slabs


class Notes(TypedDict):
    refused: list[tuple[str, str]]  # (site, reason)
    nested: list[str]
    unmatched: list[str]


class Handle:
    """``notes["refused"]`` is ``[(site, reason)]``; ``notes["nested"]`` the matched modules inside
    another seat; ``notes["unmatched"]`` the catalog seats that matched nothing in this model."""

    def __init__(self, records: list[SeatRecord], notes: Notes):
        self.records = list(records)
        self.notes = notes
        self.attached = True

    @property
    def head_slabs(self) -> int:
        return sum(r.slabs for r in self.records)

    def line(self) -> str:
        return (
            f"[frt.seats] {len(self.records)} seats ({self.head_slabs} head slabs), "
            f"{len(self.notes['refused'])} refused"
        )

    def summary(self) -> dict[str, int | bool]:
        """Counters since attach, by how the calls ran. ``guarded_calls`` and ``fallbacks`` (a guard
        missed: the original ran) count eager calls. ``captured_calls``: calls recorded into a CUDA
        graph, each counted once, at capture (its replays run the kernel with no seat code and are
        not seen). ``compiled_traces``: times torch.compile traced a seat into a graph (the compiled
        calls go uncounted). The MoE band's ``band_kernel``/``band_original`` count inside its custom
        op, compiled or not. ``seats_never_called``: seats none of these saw. ``clean``: no refusal
        and no fallback."""
        stats = [r.seat.stats for r in self.records]
        fallbacks = sum(s.fallbacks for s in stats)
        return {
            "seats": len(self.records),
            "head_slabs": self.head_slabs,
            "refused": len(self.notes["refused"]),
            "guarded_calls": sum(s.calls for s in stats),
            "captured_calls": sum(s.captured for s in stats),
            "compiled_traces": sum(s.traced for s in stats),
            "fallbacks": fallbacks,
            "seats_fell_back": sum(1 for s in stats if s.fallbacks),
            "seats_never_called": sum(
                1 for s in stats if not s.calls + s.captured + s.traced + s.band_kernel + s.band_original
            ),
            "band_kernel": sum(s.band_kernel for s in stats),
            "band_original": sum(s.band_original for s in stats),
            "attached": self.attached,
            "clean": fallbacks == 0 and not self.notes["refused"],
        }

    def detach(self) -> None:
        """Put every original module object back where it was, in reverse order. Idempotent.
        The originals were never modified, so the model computes bit-identically to before attach."""
        if not self.attached:
            return
        restore(self.records)
        self.attached = False

    def __enter__(self) -> Handle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()

    def __repr__(self) -> str:
        return f"<Handle {self.line()}{'' if self.attached else ' (detached)'}>"


def restore(records: list[SeatRecord]) -> None:
    for r in reversed(records):
        setattr(r.parent, r.attr, r.original)
        if isinstance(r.seat, MoeSeat):
            r.seat.unregister()
