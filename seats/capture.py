"""Is this call being recorded into a CUDA graph? Free to ask while no capture is underway.

A seat's Python runs only while a graph is captured: the guard decides once, the kernel it chose is
recorded, and every replay runs that kernel with no seat code at all (guards and counters stay
outside the graph; a replay cannot change shapes, dtypes or devices, so the captured decision holds
for every replay). So a call made during capture is counted apart, as ``captured``: the graph may
replay it any number of times, unseen.

torch answers the question per stream (``torch.cuda.is_current_stream_capturing``), but that is a
driver query on every call of every seat, a measurable share of a decode-sized call. Instead,
`install` wraps ``torch.cuda.CUDAGraph.capture_begin`` / ``capture_end`` once, to count the captures
underway in this process; only while one is does a seat ask the driver whether its own stream is the
one capturing. Every torch capture path goes through that class (``torch.cuda.graph``,
``make_graphed_callables``, vLLM's and SGLang's graph runners, Inductor's cudagraph trees). A capture
begun on the raw ``torch._C._CUDAGraph`` or outside torch is not seen: its calls count as eager ones.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

#: Captures begun and not yet ended, process-wide. A one-element list so that a seat's hot path
#: reads it with one global load and no attribute lookup.
UNDERWAY = [0]
_lock = threading.Lock()
_installed = False


def _shift(n: int) -> None:
    with _lock:
        UNDERWAY[0] = max(0, UNDERWAY[0] + n)


def install() -> None:
    """Wrap CUDAGraph's capture_begin/capture_end (once per process; idempotent). Nothing else of
    torch changes: the wrappers pass every argument through and only keep the count."""
    global _installed
    with _lock:
        if _installed:
            return
        import torch

        cls = torch.cuda.CUDAGraph
        begin, end = cls.capture_begin, cls.capture_end

        @functools.wraps(begin)
        def capture_begin(self: torch.cuda.CUDAGraph, *args: Any, **kwargs: Any) -> None:
            _shift(1)
            try:
                return begin(self, *args, **kwargs)
            except BaseException:
                _shift(-1)  # the capture never started
                raise

        @functools.wraps(end)
        def capture_end(self: torch.cuda.CUDAGraph, *args: Any, **kwargs: Any) -> None:
            try:
                return end(self, *args, **kwargs)
            finally:
                _shift(-1)  # ended or aborted: either way it is no longer underway

        # Replacing the methods in place is the point: every capture path goes through this class.
        cls.capture_begin, cls.capture_end = capture_begin, capture_end  # type: ignore[method-assign]
        _installed = True


def stream_capturing() -> bool:
    """The precise per-stream answer; called only while `UNDERWAY` says some capture is."""
    import torch

    return torch.cuda.is_current_stream_capturing()
