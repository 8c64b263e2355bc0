"""One call per key, whichever threads ask at once: the upstream is asked a question once per run."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Once(Generic[K, V]):
    """The first caller of a key runs `fn`; callers that come while it runs wait for its result, and
    later ones get it at once. A call that failed is not kept: the next caller asks again. With `keep`,
    at most that many answers are kept, the oldest forgotten first (asked again when next wanted): a
    process that runs for months (serve under `--allow '*'`) meets keys without end."""

    def __init__(self, keep: int | None = None) -> None:
        self._lock = threading.Lock()
        self._futures: dict[K, Future[V]] = {}  # in the order first asked: the oldest first
        self._keep = keep

    def get(self, key: K, fn: Callable[[], V]) -> V:
        with self._lock:
            fut = self._futures.get(key)
            mine = fut is None
            if fut is None:
                fut = self._futures[key] = Future()
                if self._keep is not None and len(self._futures) > self._keep:
                    self._forget_oldest()
        if mine:
            try:
                fut.set_result(fn())
            except BaseException as e:
                with self._lock:
                    del self._futures[key]
                fut.set_exception(e)
        return fut.result()

    def _forget_oldest(self) -> None:
        """Drop the oldest answered key (one still being asked is waited on by others: it stays)."""
        for key, fut in self._futures.items():
            if fut.done():
                del self._futures[key]
                return
