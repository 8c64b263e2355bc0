"""serve --upstream … --cache-max SIZE / --min-free SIZE: pull-through's cache, bounded. Pulled blobs are
evicted least recently used first (the store's side: frt.mirror.store.evict); staged ones never are.

- **When.** Before a pulled file is fetched: room is made for its listed size, so the cap holds with the
  new blob in (and with every fetch in flight: each holds its size as a `tmp/<key>.<pid>-<n>.<size>.hold`
  file while it runs, which every worker's count includes). No background sweep: a cache only grows
  by a fetch. Evictions across serve's workers (and hosts sharing the store) take turns under one lock,
  `locks/cache.lock` (and the ledger server's lock of that name), which pull-through also takes, shared,
  while it checks a variant whole and lays out its view (so no view links a blob being evicted).
- **How much.** Until the pulled bytes plus the holds plus the new file are within --cache-max, and the
  store filesystem's free space less the holds and the new file is at least --min-free, or stage's
  margin if that is larger (stage/space.free_space: the one reading, stage's check and pull-through's
  full disk read the same; below the margin the full disk would pass files through before any eviction).
  Blobs being read (or pinned: a fetched blob until its answers have opened it,
  pin.py) are waited for, up to ROOM_WAIT_S; then the file is passed through unkept (NoRoom: said once
  in the log), as is at once a single file larger than the cap: the bounds are never passed.
- **Recency, cheaply.** A blob's use is noted in this worker's memory (a dict write per answer) and
  written to the ledger (`pulled_blobs.used_at`, the later time kept) every FLUSH_S seconds and before
  each eviction: a hit never writes. Not the file's atime (noatime mounts) nor a touched mtime: any change
  of a blob's inode moves its ctime, which integrity on read takes as a changed file (re-hashing it, and
  cutting an answer in flight). Blobs used within GRACE_S, as the ledger and this worker know, go last.
- **Being served.** Every answer that sends a blob's bytes holds a shared flock on its descriptor while
  it does (`lease`); eviction takes those files exclusively without waiting, and leaves a blob it
  cannot. An answer that finds its blob evicted (gone, or its flock refused) fetches it again: the app
  is told the file is not stored (`refused`). nginx (serve --accel-redirect) opens a handed-off blob
  itself, without a flock, within milliseconds of serve's answer: GRACE_S covers it, as far as this
  worker's and the last flushed uses say; once open, nginx's bytes stay readable (it does not re-check).
- **S3.** An object store's blobs are not files on this host: `serve --store s3://…` refuses both options
  (bound its bucket with the store's own lifecycle rules).
"""

from __future__ import annotations

import fcntl
import itertools
import logging
import os
import re
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from frt.resolver.errors import BadInput, FrtError, LocalDiskError

from ..stage.space import free_space
from ..store.evict import Cached, cached, evict, mark_pulled, record_uses
from .catalog import ServedFile
from .pin import Pin

if TYPE_CHECKING:
    from prometheus_client import Counter

    from ..store.home import Home
    from .metrics import Metrics

FLUSH_S = 5.0  # recency written to the ledger at most this often per worker
GRACE_S = 10.0  # blobs used this lately are evicted only where nothing else is left
ROOM_WAIT_S = 5.0  # a fetch waits this long at most for blobs being read to be free to evict
HOLD_STALE_S = 3600.0  # a hold file older than this is a dead worker's: not counted
_UNITS = {None: 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4}
_UNITS |= {"ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30, "ti": 1 << 40}
_SIZE = re.compile(r"(\d+(?:\.\d*)?)\s*([kmgt]i?)?b?")
log = logging.getLogger("frt.serve")


def parse_size(text: str, option: str) -> int:
    """`10GiB`, `500M`, `1.5G`, `4096`: bytes (K, M, G, T powers of 1000; Ki, Mi, Gi, Ti of 1024; a
    trailing B optional). BadInput, one line, otherwise."""
    m = _SIZE.fullmatch(text.strip().lower())
    if m is None or m.group(2) not in _UNITS:
        raise BadInput(f"{option} {text!r}: expected a size such as 10GiB, 500M or 1048576 (bytes)")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


@dataclass(frozen=True)
class CacheBounds:
    """serve --cache-max / --min-free, in bytes (None: not bounded that way)."""

    max_bytes: int | None = None
    min_free: int | None = None

    def __bool__(self) -> bool:
        return self.max_bytes is not None or self.min_free is not None

    def describe(self) -> str:
        from ..stage.progress import human_bytes

        said = [f"at most {human_bytes(self.max_bytes)} pulled"] if self.max_bytes is not None else []
        said += [f"at least {human_bytes(self.min_free)} free"] if self.min_free is not None else []
        return " and ".join(said)


class NoRoom(FrtError):
    """The cache cannot take this file within its bounds now: the answer passes it through unkept
    (passthrough.py), verified as ever, and the bounds hold."""


class CacheKeeper:
    """One serve worker's side of the bounded cache: uses noted, holds taken, room made, evictions counted."""

    def __init__(self, home: Home, bounds: CacheBounds, metrics: Metrics | None = None) -> None:
        self.home, self.bounds = home, bounds
        self._uses: dict[str, float] = {}
        self._flushed = time.monotonic()
        self._lock = threading.Lock()  # the uses dict, swapped out by a flush in a fetch's thread
        self._serial = itertools.count()
        self._said_full = False
        self.counters = eviction_counters(metrics) if metrics is not None else None

    # -- on every answer (the event loop: no I/O beyond a stat) -------------------------------------

    def gone(self, f: ServedFile) -> bool:
        """Note a use of `f`'s blob; True where it is no longer stored (evicted): fetch it again."""
        now = time.time()
        self._uses[f.sha256] = now
        if time.monotonic() - self._flushed >= FLUSH_S:
            self._flushed = time.monotonic()
            threading.Thread(target=self._flush_quietly, name="frt-cache-uses", daemon=True).start()
        return not os.path.exists(f.stored_blob)

    @staticmethod
    def lease(fd: int) -> bool:
        """Hold `fd`'s blob against eviction while it is open (a shared flock, released with the fd):
        False where it is being evicted, or was (no link left): the answer fetches it again."""
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return os.fstat(fd).st_nlink > 0

    # -- around a fetch (its thread) ----------------------------------------------------------------

    @contextmanager
    def room(self, key: str, size: int) -> Iterator[None]:
        """Make room for a file of `size` bytes about to be fetched as `key`, and hold it while it is.
        Blobs being read are waited for (their answers take milliseconds), up to ROOM_WAIT_S; NoRoom
        past that, or at once for a file larger than the cap: the answer passes it through unkept."""
        if self.too_big(size):
            raise NoRoom(f"a file of {size} bytes is larger than the cache ({self.bounds.describe()})")
        hold = self.home.store.scratch.tmp / f"{key}.{os.getpid()}-{next(self._serial)}.{size}.hold"
        deadline = time.monotonic() + ROOM_WAIT_S
        while True:
            with self.exclusive():
                self._flush()
                busy, short = self._make_room(size)
                if short <= 0:
                    self._said_full = False
                    hold.parent.mkdir(parents=True, exist_ok=True)
                    hold.touch()
                    break
            if time.monotonic() >= deadline:
                self._say_full(busy)
                raise NoRoom(f"no room within {self.bounds.describe()} for {ROOM_WAIT_S:g} s")
            time.sleep(0.05)
        try:
            yield
        finally:
            hold.unlink(missing_ok=True)

    def too_big(self, size: int) -> bool:
        """A single file larger than the cap: never kept (passed through, as the full disk's files)."""
        return self.bounds.max_bytes is not None and size > self.bounds.max_bytes

    def stored(self, sha256: str) -> Pin | None:
        """Pull-through stored this blob: pinned (pin.py), then evictable from now on (unless a stage
        references it): no eviction takes it before the answers waiting for it have opened it."""
        pin = self.pin(sha256)
        mark_pulled(self.home.ledger, sha256)
        return pin

    def pin(self, sha256: str) -> Pin | None:
        """The blob held against eviction (a leased descriptor); None where it is gone or being evicted."""
        files = self.home.store.files
        assert files is not None  # the cap needs the blobs as files: an object store is refused (cache_options.capped)
        try:
            fd = os.open(files.path(sha256), os.O_RDONLY)
        except FileNotFoundError:
            return None
        if self.lease(fd):
            return Pin(fd)
        os.close(fd)
        return None

    @contextmanager
    def shared(self) -> Iterator[None]:
        """Held while pull-through checks a variant whole and links its view: no eviction meanwhile."""
        with self._cache_lock(shared=True):
            yield

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cache_lock(shared=False):
            yield

    @contextmanager
    def _cache_lock(self, shared: bool) -> Iterator[None]:
        with ExitStack() as held:
            fd = os.open(self.home.store.scratch.lock_file("cache"), os.O_RDWR | os.O_CREAT, 0o644)
            held.callback(os.close, fd)
            fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
            held.enter_context(self.home.ledger.named_lock("frt-mirror cache", shared=shared))
            yield

    def _make_room(self, size: int) -> tuple[int, int]:
        """Evict what the bounds want gone before `size` more bytes come: the blobs left because they
        are being read, and the bytes still short (<= 0: room made)."""
        # The holds first, then the ledger: a fetch marks its blob pulled before it drops its hold, so a
        # hold seen gone is a blob the ledger then shows (read the other way round, a blob landing between
        # the two reads was in neither, and the cap was passed by one file).
        held = self._holds()
        entries = cached(self.home)
        want = self._excess(sum(c.size for c in entries), self._free(), held + size)
        if want <= 0:
            return 0, want
        recent = time.time() - GRACE_S
        order = [c for c in entries if c.used_at < recent] + [c for c in entries if c.used_at >= recent]
        picked: list[Cached] = []
        for c in order:
            if want <= 0:
                break
            picked.append(c)
            want -= c.size
        out = evict(self.home, picked)
        if self.counters is not None and out.blobs:
            self.counters[0].inc(len(out.blobs))
            self.counters[1].inc(out.nbytes)
        return out.busy, want + sum(c.size for c in picked) - out.nbytes

    def _excess(self, used: int, free: int | None, more: int) -> int:
        """Bytes to evict so that `more` bytes fit both bounds."""
        over = 0
        if self.bounds.max_bytes is not None:
            over = used + more - self.bounds.max_bytes
        if self.bounds.min_free is not None and free is not None:
            over = max(over, self.bounds.min_free - (free - more))
        return over

    def _say_full(self, busy: int) -> None:
        """Once per spell: files are passed through unkept (everything left is being read, or the fetches
        in flight alone fill the cap)."""
        if not self._said_full:
            self._said_full = True
            log.warning(
                "frt-mirror: serve: the cache could not make room within %s for %g s (%d pulled blob(s) "
                "being read); passing files through unkept until it can",
                self.bounds.describe(),
                ROOM_WAIT_S,
                busy,
            )

    def _free(self) -> int | None:
        if self.bounds.min_free is None:
            return None
        # stage's reading (stage/space.py), less its margin: a cache that kept only --min-free free below
        # the margin would meet pull-through's full disk (disk.py) first, passing files through unevicted
        _, free, keep = free_space(self.home.store)
        return free - max(0, keep - self.bounds.min_free)

    def _holds(self) -> int:
        """The bytes of every fetch in flight on this store's host (each worker's hold files)."""
        total, stale = 0, time.time() - HOLD_STALE_S
        for p in self.home.store.scratch.tmp.glob("*.hold"):
            try:
                if p.stat().st_mtime >= stale:
                    total += int(p.name.rsplit(".", 2)[1])
            except (FileNotFoundError, ValueError):
                continue
        return total

    def _flush(self) -> None:
        with self._lock:
            uses, self._uses = self._uses, {}
            self._flushed = time.monotonic()
        if uses:
            record_uses(self.home.ledger, uses)

    def _flush_quietly(self) -> None:
        try:
            self._flush()
        except Exception as e:  # the ledger down or full: the uses are lost, the LRU order a little off
            if not isinstance(e, LocalDiskError):  # a full disk is said once, by disk.py
                log.debug("frt-mirror: serve: could not record the cache's uses: %s", e)


def eviction_counters(metrics: Metrics) -> tuple[Counter, Counter]:
    """frt_mirror_evicted_blobs_total and frt_mirror_evicted_bytes_total (per worker, summed at a scrape
    under serve --workers, as integrity.quarantine_counter's)."""
    from prometheus_client import Counter

    from .metrics import MULTIPROC_ENV

    registry = None if os.environ.get(MULTIPROC_ENV) else metrics.registry
    return (
        Counter(
            "frt_mirror_evicted_blobs", "Pulled blobs evicted to keep serve --cache-max / --min-free", registry=registry
        ),
        Counter(
            "frt_mirror_evicted_bytes",
            "Bytes of pulled blobs evicted (serve --cache-max / --min-free)",
            registry=registry,
        ),
    )
