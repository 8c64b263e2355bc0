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
    later ones get it at once. A call that failed is not kept: the next caller asks again."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._futures: dict[K, Future[V]] = {}

    def get(self, key: K, fn: Callable[[], V]) -> V:
        with self._lock:
            fut = self._futures.get(key)
            mine = fut is None
            if fut is None:
                fut = self._futures[key] = Future()
        if mine:
            try:
                fut.set_result(fn())
            except BaseException as e:
                with self._lock:
                    del self._futures[key]
                fut.set_exception(e)
        return fut.result()
