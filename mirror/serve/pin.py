"""serve --cache-max: a pulled blob held against eviction from the moment its fetch stores it until every
answer that waited for that fetch has opened it itself (cache_cap.py).

Before, a blob stored by a fetch was evictable at once: under a cap much smaller than what clients ask
for, another fetch's eviction could take it before the waiting answer opened it, and the answer sent
its client a 307 to the same URL, which could meet the same fate again (httpx stops at 20 redirects).

- **The pin.** The fetch (its thread) opens the blob and takes a shared flock on it before the blob is
  marked pulled (so before any eviction may pick it), or, where another worker stored it, under the cache
  lock shared (so no eviction runs meanwhile). Eviction takes a blob's flock exclusive without waiting
  and leaves a blob it cannot: a pinned blob stays. The flight keeps that pin; every answer that waited
  for it takes a share (a dup of the descriptor: the same flock) the moment the flight lands, with no
  await between, and the flight's own is closed once its last waiter has taken its share. An answer's
  share lives in its ASGI scope and goes when its BlobResponse is done (or with the scope).
- **At most one self-redirect.** An answer that still finds its blob gone (evicted between a request's
  look and its open, with no fetch in between) redirects to the same URL marked `?frt-evicted=1`; a marked
  request is answered through a fetch (found stored, then pinned; or fetched again; or passed through
  unkept), never redirected again: a marked request that finds its blob gone all the same gets 503 with
  Retry-After.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from starlette.types import Scope

SCOPE_KEY = "frt.pin"  # the answer's share, in its ASGI scope
MARK = b"frt-evicted=1"  # the query of the one self-redirect


class Pin:
    """An open descriptor of a stored blob holding a shared flock on it (cache_cap.CacheKeeper.lease)."""

    def __init__(self, fd: int) -> None:
        self.fd: int | None = fd

    def share(self) -> Pin | None:
        """Another holder of the same flock (closing either keeps the other's); None once closed."""
        return Pin(os.dup(self.fd)) if self.fd is not None else None

    def close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:  # an answer that never ran (its request failed first): let go with it
        self.close()


class Pins:
    """One serve process's landed fetches' pins, each kept until the last answer that waited for its flight
    has taken a share (or at once, where none waited)."""

    def __init__(self) -> None:
        self._pins: dict[str, Pin] = {}  # blob key -> its landed fetch's pin
        self._waiting: dict[str, int] = {}  # blob key -> answers waiting for its flight

    def keep(self, key: str, pin: Pin | None) -> None:
        if pin is not None and (old := self._pins.pop(key, None)) is not pin:
            self._pins[key] = pin
            if old is not None:  # an older flight's, whose waiters all have their shares by now
                old.close()

    @contextmanager
    def waiting(self, key: str, in_flight: Callable[[], bool]) -> Iterator[None]:
        """An answer waits for the flight of blob `key`, and takes its share when it lands (`share`, with no
        await between): the last one to go lets the flight's pin go, once the flight has landed."""
        self._waiting[key] = self._waiting.get(key, 0) + 1
        try:
            yield
        finally:
            self._waiting[key] -= 1
            if not self._waiting[key]:
                del self._waiting[key]
                if not in_flight():
                    self._let_go(key)

    def share(self, key: str) -> Pin | None:
        pin = self._pins.get(key)
        return pin.share() if pin is not None else None

    def landed(self, key: str) -> None:
        """The flight of `key` is over: with nobody waiting for it, its pin goes now."""
        if key not in self._waiting:
            self._let_go(key)

    def _let_go(self, key: str) -> None:
        if (pin := self._pins.pop(key, None)) is not None:
            pin.close()


def hold(scope: Scope, pin: Pin | None) -> None:
    """The answer of this request holds `pin` until it has opened the blob itself (release)."""
    if pin is not None:
        release(scope)
        scope[SCOPE_KEY] = pin


def release(scope: Scope) -> None:
    pin = scope.pop(SCOPE_KEY, None)
    if pin is not None:
        pin.close()


def marked(scope: Scope) -> bool:
    """Is this request the one self-redirect of an answer whose blob was evicted?"""
    return MARK in scope.get("query_string", b"").split(b"&")


def mark(scope: Scope) -> str:
    """The URL of this request, marked as its one self-redirect."""
    raw = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
    query = scope.get("query_string", b"")
    return f"{raw}?{(query + b'&' if query else b'').decode('latin-1')}{MARK.decode()}"
