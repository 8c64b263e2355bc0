"""Integrity on read: serve completes no answer with bytes it has not verified (DESIGN.md).

A blob was verified when it entered the store, but its bytes can change after that: bit rot or a bad
disk (no metadata moves), an operator's edit (`dd conv=notrunc`, then mtime put back with `touch -r`).
Clients check only sizes, so serve checks. The rule, for every answer with a body: its bytes are of a
file this process hashed whole lately, and still that very file when the last chunk goes; or they are
hashed as they are sent and the last chunk waits for the digest.

- What this process verified is cached, keyed on (device, inode, size, mtime_ns, ctime_ns). Every
  change made through the filesystem moves ctime, which no user can set (os.utime sets atime and mtime
  only), so a changed byte makes the key miss. A change below the filesystem (bit rot) keeps the key:
  an entry is trusted FRT_SERVE_VERIFY_TTL seconds (default 3600; 0: hash every answer), then hashed
  again. Hashing every whole GET instead cost serve alone 26% (one client) to 42% (64) of its
  throughput, A/B against the code before on 2 cores; a fresh entry costs two fstats (~5 us).
- A whole-file GET not in the cache is hashed as it is sent (blob.BlobResponse), the last chunk held
  back until the sha256 matches the blob's name; GETs of it meanwhile send it unhashed and wait for
  that one's word before their last chunk (64 clients' first GETs hash it once). On a mismatch the
  answer is cut (fewer bytes than Content-Length: the client keeps an `.incomplete` file, never a
  whole wrong one); a file of one chunk is checked before its status line: the client gets a 500.
- A Range and a GET handed to nginx (X-Accel-Redirect) cannot hash what they send: the whole blob is
  verified first (`ensure`: the cache, or one hash for every request waiting on it).
- A blob found bad is quarantined: this process answers 500 for it (HEAD too) while the store holds
  that same file; it is moved out of the store into `<home>/quarantine/` where the home is writable
  (so nginx, the other replicas and `stage` no longer find it: `stage` fetches it again, and serve
  with --upstream fetches it again on the next request); frt_mirror_quarantined_blobs_total counts it
  on /metrics; and a `quarantine` event is recorded (the page's "Last quarantine"; `verify` names it)
  from a thread of its own, since the ledger may be down and serve never waits for it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import sys
import threading
import time
from typing import TYPE_CHECKING

from frt.resolver.settings import env_number

from ..events import QUARANTINE
from ..home_path import HomeLayout
from ..store.blobs import blob_relpath
from .catalog import ServedFile
from .protocol import HubError

if TYPE_CHECKING:
    from pathlib import Path

    from prometheus_client import Counter

    from ..store.home import Home
    from .cache_cap import CacheKeeper
    from .metrics import Metrics

# (st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns): see file_key
FileKey = tuple[int, int, int, int, int]

# QUARANTINE: the event's kind (the folder bad files are moved to: HomeLayout.quarantine)
TTL_ENV = "FRT_SERVE_VERIFY_TTL"
READ = 4 << 20
MAX_ENTRIES = 1 << 16  # blobs remembered as verified: past that the cache starts over (re-hashing)
log = logging.getLogger("frt.serve")


def file_key(st: os.stat_result) -> FileKey:
    """What a changed byte cannot keep (short of a change below the filesystem): see the module's doc."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def hash_whole(fd: int, size: int) -> str | None:
    """sha256 of the open file's first `size` bytes; None if it has fewer."""
    h, off = hashlib.sha256(), 0
    while off < size:
        chunk = os.pread(fd, min(READ, size - off), off)
        if not chunk:
            return None
        h.update(chunk)
        off += len(chunk)
    return h.hexdigest()


class Integrity:
    """One serve process's record of the blobs it verified and those it found bad. `home` (None in
    bare test apps): where bad blobs are moved from and their events recorded."""

    def __init__(self, home: Home | None = None, metrics: Metrics | None = None, ttl: float | None = None) -> None:
        self.home = home
        self.ttl = env_number(TTL_ENV, 3600.0) if ttl is None else ttl
        self._verified: dict[str, tuple[FileKey, float]] = {}  # sha256 -> (file key, when verified)
        self.bad: dict[str, FileKey | None] = {}  # sha256 -> key of the file found bad; None: gone from the store
        self._checks: dict[str, asyncio.Future[None]] = {}  # sha256 -> its whole-blob check in flight
        self.counter = quarantine_counter(metrics) if metrics is not None else None
        self.cache: CacheKeeper | None = None  # serve --cache-max: uses noted, blobs leased (cache_cap.py)

    def handoff(self, f: ServedFile, prefix: str) -> tuple[tuple[bytes, bytes], ...] | None:
        """The headers (X-Accel-Redirect) that hand a GET of `f` to nginx, which sends the file from its
        location over the store; None where the file is not the one this process verified lately."""
        try:
            if not self.fresh(f, os.stat(f.stored_blob)):
                return None
        except FileNotFoundError:
            return None
        return ((b"x-accel-redirect", f"{prefix}/{blob_relpath(f.sha256)}".encode()),)

    def fresh(self, f: ServedFile, st: os.stat_result) -> bool:
        hit = self._verified.get(f.sha256)
        return hit is not None and hit[0] == file_key(st) and time.monotonic() - hit[1] < self.ttl

    def fresh_key(self, f: ServedFile, st: os.stat_result) -> FileKey | None:
        """fresh(), answering the key it matched (None: not fresh)."""
        hit = self._verified.get(f.sha256)
        if hit is not None and time.monotonic() - hit[1] < self.ttl and hit[0] == (key := file_key(st)):
            return key
        return None

    def same(self, f: ServedFile, st: os.stat_result) -> bool:
        """Is `st` still the file verified last (however long ago)? What a Range checks at its end."""
        hit = self._verified.get(f.sha256)
        return hit is not None and hit[0] == file_key(st)

    def forget(self, f: ServedFile) -> None:
        self._verified.pop(f.sha256, None)

    def vouch(self, f: ServedFile, st: os.stat_result) -> None:
        """The file `st` describes hashed to its name just now."""
        if len(self._verified) >= MAX_ENTRIES:
            self._verified.clear()
        self._verified[f.sha256] = (file_key(st), time.monotonic())

    def refused(self, f: ServedFile) -> bool:
        """Is `f` quarantined, and the store still holds the very file found bad (or nothing)? A file
        put there since (stage, import, pull-through) is judged afresh. Under a cache cap, a blob
        evicted is refused too: pull-through fetches it again."""
        if self.cache is not None and self.cache.gone(f):
            return True
        if f.sha256 not in self.bad:
            return False
        try:
            st = os.stat(f.stored_blob)
        except FileNotFoundError:
            return True
        if file_key(st) == self.bad[f.sha256]:
            return True
        del self.bad[f.sha256]
        return False

    def error(self, f: ServedFile) -> HubError:
        """What a request for a refused blob gets: a 500, which nginx-conf's nginx does not retry on
        another replica (a replica that has not looked yet could hand the same bad file to nginx)."""
        return HubError(
            500,
            None,
            f"{f.path}: the mirror's stored copy failed verification (blob {f.sha256}) "
            "and is quarantined: 'frt-mirror stage' fetches it again",
        )

    def gone(self, f: ServedFile) -> HubError:
        self.bad[f.sha256] = None  # moved out by another process, or removed: as refused until it is back
        return HubError(
            500,
            None,
            f"{f.path}: blob {f.sha256} is no longer in the mirror's store "
            "(quarantined, or collected): 'frt-mirror verify' says which",
        )

    async def ensure(self, f: ServedFile) -> None:
        """Raise a 500 unless the whole blob is verified now: cached, or hashed once for every request that
        waits (by an answer streaming it whole, or here in a thread). What a Range or an nginx hand-off
        sends is then these bytes."""
        for _ in range(3):  # each turn waits for one check; a file changing under every one is refused
            try:
                st = os.stat(f.stored_blob)
            except FileNotFoundError:
                raise self.gone(f) from None
            if self.fresh(f, st):
                return
            if self.bad.get(f.sha256, ()) == file_key(st):
                raise self.error(f)
            fut = self._checks.get(f.sha256)
            if fut is None:
                fut = self._checks[f.sha256] = asyncio.get_running_loop().run_in_executor(None, self._check, f)
                fut.add_done_callback(lambda done: self._checked(f, done))
            await asyncio.shield(fut)
        raise HubError(500, None, f"{f.path}: blob {f.sha256} kept changing on disk while it was verified")

    def begin(self, f: ServedFile) -> asyncio.Future[None] | None:
        """This answer will hash `f` as it sends it, for every request waiting meanwhile; None: a check
        of it is already on its way (wait for it: `ensure`)."""
        if f.sha256 in self._checks:
            return None
        fut = self._checks[f.sha256] = asyncio.get_running_loop().create_future()
        return fut

    def end(self, f: ServedFile, fut: asyncio.Future[None]) -> None:
        """The answer `begin` made the verifier is over (vouched, quarantined, or neither: cut short)."""
        if not fut.done():
            fut.set_result(None)
        self._checked(f, fut)

    def _checked(self, f: ServedFile, fut: asyncio.Future[None]) -> None:
        if self._checks.get(f.sha256) is fut:
            del self._checks[f.sha256]

    def _check(self, f: ServedFile) -> None:
        """In a thread: hash the blob whole; vouch for it, or quarantine it (a file gone: neither)."""
        try:
            fd = os.open(f.stored_blob, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            if self.cache is not None and not self.cache.lease(fd):  # being evicted: nothing to vouch for
                return
            st = os.fstat(fd)
            got = hash_whole(fd, f.size)
            if got != f.sha256:
                self.quarantine(f, st, got)
            elif file_key(os.fstat(fd)) == file_key(st):  # changed while hashed: the next turn hashes again
                self.vouch(f, st)
        finally:
            os.close(fd)

    def quarantine(self, f: ServedFile, st: os.stat_result, got: str | None) -> None:
        """`f`'s file (`st`, open, just hashed to `got`) is not its bytes: refuse it, move it out of the
        store, count it and record it. Quick (a rename); the ledger is written from another thread."""
        key = file_key(st)
        first = self.bad.get(f.sha256, ()) != key
        self.bad[f.sha256] = key
        self._verified.pop(f.sha256, None)
        if not first:
            return
        if self.counter is not None:
            self.counter.inc()
        where = self._set_aside(f, st)
        detail = (
            f"{f.path}: content hashes to {got or f'fewer than {f.size} bytes'}; "
            f"{f'moved to {where}' if where else 'left in place (the home is read-only here)'}"
        )
        log.warning("frt-mirror: serve: blob %s failed verification on read, quarantined: %s", f.sha256, detail)
        if self.home is not None:
            threading.Thread(
                target=record_quarantine, args=(self.home, f, detail), name="frt-quarantine", daemon=True
            ).start()

    def _set_aside(self, f: ServedFile, st: os.stat_result) -> Path | None:
        """Move the bad file out of the store (only if the store still holds that very file), or None."""
        if self.home is None:
            return None
        dest = HomeLayout(self.home.root).quarantine / f"{f.sha256}.{time.time_ns()}"
        try:
            if os.stat(f.stored_blob).st_ino != st.st_ino:
                return None
            dest.parent.mkdir(exist_ok=True)
            os.rename(f.stored_blob, dest)
        except OSError:
            return None
        return dest


def record_quarantine(home: Home, f: ServedFile, detail: str) -> None:
    """The quarantine in the ledger (verify names it); said on stderr where the ledger cannot take it."""
    from ..events import record_event

    try:
        record_event(home.ledger, QUARANTINE, ref=f.sha256, files=1, nbytes=f.size, detail=detail)
    except Exception as e:  # the ledger down or read-only: the log line and /metrics still say it
        print(
            f"frt-mirror: warning: could not record the quarantine of blob {f.sha256} in the ledger: {e}",
            file=sys.stderr,
            flush=True,
        )


def quarantine_counter(metrics: Metrics) -> Counter:
    """frt_mirror_quarantined_blobs_total, beside metrics.Metrics' own series (in each worker's file
    under serve --workers, summed at a scrape like theirs)."""
    from prometheus_client import Counter

    from .metrics import MULTIPROC_ENV

    registry = None if os.environ.get(MULTIPROC_ENV) else metrics.registry
    return Counter(
        "frt_mirror_quarantined_blobs",
        "Blobs serve found changed on disk (their bytes no longer hash to their name) and quarantined",
        registry=registry,
    )
