"""The home's store lock: writers of the store (stage, pull-through) hold it shared; gc, unstage and
import (which may take views away: an incremental bundle's removals) hold it exclusive.

Why a home-wide lock, beside the per-blob one a download holds (Scratch.lock): a stager stores a
blob minutes before the staged row that makes it referenced, and it reuses a blob already in the
store without taking any lock at all. A gc that looked only at staged rows, views and per-blob locks
would remove such a blob from under the stager, whose view then cannot be linked. So gc waits for
the stagers running now, and a stager that starts meanwhile waits for gc (which only unlinks files).

On one host the lock is an flock on `locks/store.lock`; on a server ledger it is also the server's
advisory lock (shared or exclusive), since many shared filesystems do not honour file locks across
hosts, and the server drops it when its holder dies.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from .home import Home

_NAME = "frt-mirror store writers"


def _nothing(_what: str) -> None:
    pass


@contextmanager
def store_writer(home: Home) -> Iterator[None]:
    """Held by a command that puts blobs in the store and then records what references them."""
    with _store_lock(home, exclusive=False, on_wait=_nothing):
        yield


@contextmanager
def store_collector(home: Home, on_wait: Callable[[str], None] = _nothing) -> Iterator[None]:
    """Held by gc, unstage and import: no writer is between storing a blob and recording its reference,
    nor linking a view.
    `on_wait` is told once, before waiting, that a writer holds the store."""
    with _store_lock(home, exclusive=True, on_wait=on_wait):
        yield


@contextmanager
def _store_lock(home: Home, *, exclusive: bool, on_wait: Callable[[str], None]) -> Iterator[None]:
    told: list[bool] = []

    def wait_note() -> None:
        if not told:
            told.append(True)
            on_wait("waiting for the stage or import running in this home to finish")

    with ExitStack() as held:
        held.enter_context(_flock(home.store.scratch.lock_file("store"), exclusive, wait_note))
        held.enter_context(home.ledger.named_lock(_NAME, shared=not exclusive, on_wait=wait_note))
        yield


@contextmanager
def _flock(path: Path, exclusive: bool, wait_note: Callable[[], None]) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        op = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        try:
            fcntl.flock(fd, op | fcntl.LOCK_NB)
        except BlockingIOError:
            wait_note()
            fcntl.flock(fd, op)
        yield
    finally:
        os.close(fd)  # and with it the lock
