"""Fault injection for the fake Hub: failing statuses, dropped bodies, slow answers.

Rules match on a substring of the raw request path (with query). All methods are thread-safe: the
server's handler threads consume rules while the test thread adds them.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass
class _Fail:
    remaining: int
    status: int
    match: str


@dataclass
class _Drop:
    remaining: int
    match: str
    nbytes: int


class Faults:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fails: list[_Fail] = []
        self._drops: list[_Drop] = []
        self._delays: list[tuple[str, float]] = []
        self._rates: list[tuple[str, float]] = []
        self._holds: list[tuple[str, int]] = []
        self._whole: list[str] = []
        self._released = threading.Event()

    def fail_next(self, n: int, status: int = 503, match: str = "") -> None:
        """The next `n` requests whose raw path contains `match` get `status` (no X-Error-Code)."""
        with self._lock:
            self._fails.append(_Fail(n, status, match))

    def drop_after(self, match: str, nbytes: int, times: int = 1) -> None:
        """The next `times` file-body GETs (resolve, resolve-cache or CDN) matching `match` send full
        headers, `nbytes` of body, then EOF. A redirect carries no body and takes no drop."""
        with self._lock:
            self._drops.append(_Drop(times, match, nbytes))

    def delay(self, match: str, seconds: float) -> None:
        """Sleep `seconds` before answering any request matching `match` (until `clear()`)."""
        with self._lock:
            self._delays.append((match, seconds))

    def throttle(self, match: str, bytes_per_s: float) -> None:
        """Serve matching file bodies (resolve, resolve-cache, CDN) at most this fast per connection
        (until `clear()`): a WAN link, and a window wide enough for a test to kill a client mid-file."""
        with self._lock:
            self._rates.append((match, bytes_per_s))

    def ignore_range(self, match: str) -> None:
        """Answer matching file bodies whole, a 200, whatever `Range` asks (until `clear()`): what a CDN
        does that will not serve a range of a compressed answer (huggingface_hub handles it)."""
        with self._lock:
            self._whole.append(match)

    def hold(self, match: str, after: int) -> None:
        """Matching file bodies send `after` bytes, then wait for `release()`: a download that stays in
        flight for exactly as long as a test needs, with no clock in it."""
        with self._lock:
            self._holds.append((match, after))
            self._released.clear()

    def release(self) -> None:
        """Let held bodies (and any that would be held) finish."""
        with self._lock:
            self._holds.clear()
            self._released.set()

    def clear(self) -> None:
        self.release()
        with self._lock:
            self._rates.clear()
            self._fails.clear()
            self._drops.clear()
            self._delays.clear()
            self._whole.clear()

    # -- used by the server --------------------------------------------------------------------

    def delay_for(self, path: str) -> float:
        with self._lock:
            return sum(s for m, s in self._delays if m in path)

    def ranges_ignored(self, path: str) -> bool:
        with self._lock:
            return any(m in path for m in self._whole)

    def rate_for(self, path: str) -> float | None:
        with self._lock:
            rates = [r for m, r in self._rates if m in path]
        return min(rates) if rates else None

    def hold_for(self, path: str) -> int | None:
        with self._lock:
            return next((n for m, n in self._holds if m in path), None)

    def wait_released(self, timeout: float = 300.0) -> None:
        self._released.wait(timeout)

    def take_failure(self, path: str) -> int | None:
        return self._take(self._fails, path, lambda r: r.status)

    def take_drop(self, path: str) -> int | None:
        return self._take(self._drops, path, lambda r: r.nbytes)

    def _take(self, rules, path, value):
        # First matching rule with budget left wins; spent rules are removed.
        with self._lock:
            for rule in rules:
                if rule.match in path and rule.remaining > 0:
                    rule.remaining -= 1
                    if rule.remaining == 0:
                        rules.remove(rule)
                    return value(rule)
        return None
