"""A call's cost over another's, paired call by call: what bench.seats reads the per-call target from.

Loops of one function at a time (bench.call_loops.per_call_us) pair two functions only round by round,
~10 ms apart. On the H200's host the speed of Python moved 1.6-3x within one run (a bare call: 22 ns
idle, 63 ns inside the benchmark), so a loop that fell in a slow stretch is charged microseconds that
are not its own, and the worst of a dozen such sites is mostly noise: seat-direct read -1.4 to +5.2 us
across sites whose seat code is the same.

Here every function is called once per step, each call timed alone (``perf_counter_ns`` around the
call, the same clock cost for each), in an order drawn anew each step: a turned order would keep each
function behind the same neighbour, whose leftovers in the caches (a copy of the weights, say) it would
then always pay for. ``sync`` runs before each
call, off the clock, so each call starts on an idle device and is charged for issuing its own work,
not for waiting on work queued before it: the host-side cost, which is where a seat's Python is paid
(a GPU-bound call's device time is left out, which can only make the ratio stricter). A seat's cost
is then the median, over steps, of its call less the paired call of the same step, microseconds apart:
the host's drift cancels, and so does an interrupt, which lands in one step of thousands. The 95%
interval of that median is distribution-free (order statistics of the sorted differences).
"""

from __future__ import annotations

import gc
import math
import random
import statistics
import time
from dataclasses import dataclass


def per_call_steps(fns: dict, x, steps: int, sync=lambda: None) -> dict[str, list[int]]:
    """name -> the ns of each of its calls, one per step, in step order. The garbage collector is off
    while they run: a collection would be charged to whichever call it fell in."""
    names = list(fns)
    calls = [fns[n] for n in names]
    out: dict[str, list[int]] = {n: [0] * steps for n in names}
    cols = [out[n] for n in names]
    clock, order, rng = time.perf_counter_ns, list(range(len(names))), random.Random(0)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for s in range(steps):
            rng.shuffle(order)
            for j in order:
                fn = calls[j]
                sync()
                t0 = clock()
                fn(x)
                cols[j][s] = clock() - t0
    finally:
        if was_enabled:
            gc.enable()
    return out


@dataclass(frozen=True)
class Paired:
    """a's cost over b, call by call: ns (median over steps of a - b, and its 95% interval); b's median
    us per call; the ratio a/b that cost makes of it."""

    ns: float
    low: float
    high: float
    base_us: float
    steps: int

    @property
    def ratio(self) -> float:
        return 1 + self.ns / (self.base_us * 1e3)

    @property
    def ratio_high(self) -> float:
        return 1 + self.high / (self.base_us * 1e3)


def paired(per_step: dict[str, list[int]], a: str, b: str) -> Paired:
    d = sorted(x - y for x, y in zip(per_step[a], per_step[b], strict=False))
    n = len(d)
    half = 1.96 * math.sqrt(n) / 2
    lo, hi = max(0, math.floor(n / 2 - half)), min(n - 1, math.ceil(n / 2 + half))
    return Paired(float(statistics.median(d)), float(d[lo]), float(d[hi]), statistics.median(per_step[b]) / 1e3, n)


def steps_for(fns: dict, x, budget: float, sync=lambda: None, lo: int = 200, hi: int = 20000) -> int:
    """How many steps fit in about `budget` seconds (lo..hi), from a short trial; warms every function."""
    trial = 20
    t0 = time.perf_counter()
    per_call_steps(fns, x, trial, sync)
    per_step = (time.perf_counter() - t0) / trial
    return max(lo, min(hi, int(budget / per_step)))
