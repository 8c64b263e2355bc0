"""Per-call cost in loops, one function at a time, paired round by round: what bench.seats and
bench.seat_cost time with, beside the call-by-call pairing of bench/call_pairs.py.

A loop of `calls` calls of one function gives its mean per call with the clock's cost spread thin; its
pairing with another function is only as close as their two loops, ~10 ms apart in a round.
"""

from __future__ import annotations

import gc
import statistics
import time


def median_s(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def per_call_us(fns: dict, x, calls: int, rounds: int, sync=lambda: None) -> dict[str, list[float]]:
    """Per function, its us per call in each of `rounds` rounds. A round runs one loop of `calls` calls
    of every function, so drift in the machine hits all of them alike, in an order that turns around
    each round (no function always runs right after another, or first); ``sync`` ends each loop (a
    device sync on a GPU, so queued work is paid for). The garbage collector is off while the loops
    run, as in timeit: a collection would be charged to whichever loop it fell in."""
    order = list(fns.items())
    per_round: dict[str, list[float]] = {name: [] for name in fns}
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for r in range(rounds):
            for name, fn in order if r % 2 == 0 else order[::-1]:
                sync()
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn(x)
                sync()
                per_round[name].append((time.perf_counter() - t0) / calls * 1e6)
    finally:
        if was_enabled:
            gc.enable()
    return per_round


def medians(per_round: dict[str, list[float]]) -> dict[str, float]:
    return {name: statistics.median(ts) for name, ts in per_round.items()}


def paired(per_round: dict[str, list[float]], a: str, b: str) -> tuple[float, float]:
    """(median of a/b, median of a-b in us), each taken round by round: the two ran side by side in a
    round, so what slowed that round slowed both, and the ratio of their medians would not cancel it."""
    pairs = list(zip(per_round[a], per_round[b], strict=False))
    return statistics.median(x / y for x, y in pairs), statistics.median(x - y for x, y in pairs)
