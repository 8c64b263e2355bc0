"""This host's scratch beside a blob store, whichever store holds the blobs: tmp/, where a download or an
import accumulates as a `.part` until its bytes are verified (a store takes only verified bytes: kill -9
at any moment leaves the old state or the new blob, never half a file under a blob's name), and locks/,
one file lock per blob being written. Both stay local per host, on an object store too.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path

from ..home_path import HomeLayout

# A lock across hosts by name (Ledger.named_lock on a server ledger); what it yields is not used.
SharedLock = Callable[[str], AbstractContextManager[object]]


class Scratch:
    """`shared_lock(key)`: a lock every host sharing the store honours (the ledger's server gives one: many
    shared filesystems do not honour file locks across hosts); the file lock is taken as well."""

    def __init__(self, home: Path, shared_lock: SharedLock | None = None):
        layout = HomeLayout(home)
        self.tmp, self.locks, self.shared_lock = layout.tmp, layout.locks, shared_lock

    def part_path(self, key: str) -> Path:
        """Where an unfinished download of `key` (its expected sha256 or git oid) accumulates."""
        return _made(self.tmp) / f"{key}.part"

    def lock_file(self, name: str) -> Path:
        return _made(self.locks) / f"{name}.lock"

    @contextmanager
    def lock(self, *keys: str, wait: bool = True) -> Iterator[None]:
        """One writer per blob across processes and hosts: two stagers never share a `.part` file. With
        several keys (a blob's sha256 and the git oid a small file is fetched by), each, in one order.
        `wait=False`: filelock.Timeout at once where another holds one (this host's file lock)."""
        from filelock import FileLock  # here: a home that is only read (env on a job start) takes no lock

        with ExitStack() as held:
            for key in sorted(set(keys)):
                if self.shared_lock is not None:
                    held.enter_context(self.shared_lock(f"blob {key}"))
                held.enter_context(FileLock(str(self.lock_file(key)), timeout=-1 if wait else 0))
            yield

    def sweep_parts(self, pattern: str, older_than_s: float = 600) -> None:
        """Drop unfinished files nobody will resume (older than any live writer's)."""
        cutoff = time.time() - older_than_s
        for p in self.tmp.glob(pattern):
            try:
                if p.stat().st_mtime < cutoff:
                    p.unlink()
            except FileNotFoundError:
                pass


def _made(folder: Path) -> Path:
    """`folder`, made on first use rather than when a store is opened: a command that only reads a home
    (or one given the wrong --home: nginx-conf) creates nothing in it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        # A read-only home (a cluster's mount) is only read: a missing folder just holds nothing. A
        # writer still fails, at its first write, saying where.
        if e.errno not in (errno.EROFS, errno.EACCES):
            raise
    return folder
