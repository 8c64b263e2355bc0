"""Evicting pulled blobs: what `serve --upstream … --cache-max SIZE / --min-free SIZE` takes out of the store
to stay inside its bounds (the policy, when and how much: frt.mirror.serve.cache_cap).

What may go: a blob pull-through stored (a `pulled_blobs` row, written as it is stored) that no staged row
of a target (a `stage`, an import), no model selection and no staged row's wheel references. A pulled
kernel variant's own rows (target `pulled:<variant>`) do not keep it: evicting one of its blobs takes
those rows away first (delete_staged: one write that bumps the change serial, so the replicas' catalogs
follow, and leaves tombstones for a ledger rebuild), then the variant's view, then the blob's records, then
its file (as gc: a record never claims bytes the store lacks). `verify` and the page see a home where the
variant is no longer staged, and where the blob is simply not stored: the next request pulls it again.
Model files pulled through are recorded as a staged model selection, as `stage` records one, and stay.

Being served: every answer that sends a blob's bytes holds a shared flock on its open descriptor
(serve/cache_cap.CacheKeeper.lease); eviction takes each affected file's flock exclusive without waiting,
and leaves the blob where it cannot (it is being read now; the next one in LRU order is taken). An open
descriptor alone would keep the bytes readable, but not the answer whole: unlinking a file moves its
ctime, and integrity on read (serve/integrity.py) then cuts the answer as "changed since verified". The
flocks are taken on every file whose link count changes (the blob, and every blob of a view dropped).

A stager linking a pulled blob into a view of its own (found stored, so never locked) is seen by the
blob's link count, read once the pulled views are gone: more than one link left, and the blob stays.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlalchemy import delete, select, update

from frt.resolver.ledger import Ledger
from frt.resolver.ledger.dialect import insert_for
from frt.resolver.ledger.retry import retried

from ..events import record_event
from ..schema import Blob, PulledBlob
from .blob_reads import in_batches
from .home import Home
from .records import blob_for, delete_blob_records, staged_rows, variant_files, wheel_rows
from .staged import StagedRow
from .unstage import unstage_rows

EVICT = "evict"  # the events kind: the page's "Last evict", frt_mirror_evicted_* on /metrics


@dataclass(frozen=True)
class Cached:
    """A blob eviction may take: its sha256, git oid, size and last use (seconds since the epoch)."""

    sha256: str
    git_oid: str
    size: int
    used_at: float


@dataclass
class Evicted:
    blobs: list[Cached] = field(default_factory=list)
    rows: list[StagedRow] = field(default_factory=list)  # pulled variants no longer staged
    busy: int = 0  # blobs left in place: being read, or linked by a stager

    @property
    def nbytes(self) -> int:
        return sum(c.size for c in self.blobs)


@retried
def mark_pulled(ledger: Ledger, sha256: str) -> None:
    """Pull-through stored this blob (evictable, unless a staged row of a target takes it)."""
    with ledger.session() as s:
        s.execute(insert_for(s)(PulledBlob).on_conflict_do_nothing(), [{"sha256": sha256}])


@retried
def record_uses(ledger: Ledger, uses: dict[str, float]) -> None:
    """When each blob was last asked for (epoch seconds), flushed from serve's memory: a later time only."""
    with ledger.session() as s:
        for sha, at in sorted(uses.items()):
            when = datetime.fromtimestamp(at, UTC).replace(tzinfo=None)
            s.execute(
                update(PulledBlob).where(PulledBlob.sha256 == sha, PulledBlob.used_at < when).values(used_at=when)
            )


def cached(home: Home) -> list[Cached]:
    """Every blob eviction may take, stored now, least recently used first."""
    ledger, store = home.ledger, home.store
    rows = staged_rows(ledger)
    kept = [r for r in rows if not r.is_pulled]
    files = variant_files(ledger, sorted({(r.repo, r.commit, r.variant) for r in kept}))
    blobs = blob_for(ledger, files)
    referenced = {sha for sha in blobs.values() if sha}
    unresolved = {f.git_oid for f, sha in blobs.items() if sha is None}
    referenced |= {sha for _, _, sha, _ in wheel_rows(ledger, {w for r in rows for w in r.wheels}).values()}
    out = [
        c for c in _marked(ledger) if c.sha256 not in referenced and c.git_oid not in unresolved and store.has(c.sha256)
    ]
    return sorted(out, key=lambda c: (c.used_at, c.sha256))


def evict(home: Home, victims: Iterable[Cached]) -> Evicted:
    """Take `victims` out of the store (those not being read), with the pulled rows and views that name
    them. The caller holds the cache lock (serve/cache_cap.py) exclusively."""
    ledger, out = home.ledger, Evicted()
    rows = [r for r in staged_rows(ledger) if r.is_pulled]
    files = {key: variant_files(ledger, [key]) for key in sorted({(r.repo, r.commit, r.variant) for r in rows})}
    shas = {key: {sha for sha in blob_for(ledger, fs).values() if sha} for key, fs in files.items()}
    for c in victims:
        views = [key for key, s in shas.items() if c.sha256 in s]
        touched = {c.sha256}.union(*(shas[k] for k in views))  # every file whose link count changes
        with _exclusive(home, touched) as held:
            if not held:
                out.busy += 1
                continue
            dropped = [r for r in rows if (r.repo, r.commit, r.variant) in views]
            unstage_rows(home, dropped)
            rows = [r for r in rows if r not in dropped]
            for key in views:
                del shas[key]
            out.rows += dropped
            if _links(home, c.sha256) > 1:  # a stager's view links it now: it stays
                out.busy += 1
                continue
            delete_blob_records(ledger, [c.sha256])
            _unmark(ledger, [c.sha256])
            home.store.remove(c.sha256, c.git_oid)
            out.blobs.append(c)
    if out.blobs:
        record_event(
            ledger,
            EVICT,
            files=len(out.blobs),
            nbytes=out.nbytes,
            detail=f"least recently used pulled blob(s); {len(out.rows)} pulled variant row(s) unstaged",
        )
    return out


@contextmanager
def _exclusive(home: Home, shas: set[str]) -> Iterator[bool]:
    """Each stored file of `shas` flocked exclusively, without waiting: True; False where any is being
    read (a reader's shared flock), and then none is held."""
    files = home.store.files
    assert files is not None  # serve refuses a cap over an object store
    with ExitStack() as held:
        for sha in sorted(shas):
            try:
                fd = os.open(files.path(sha), os.O_RDONLY)
            except FileNotFoundError:
                continue
            held.callback(os.close, fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
        yield True


def _links(home: Home, sha: str) -> int:
    files = home.store.files
    assert files is not None
    try:
        return os.stat(files.path(sha)).st_nlink
    except FileNotFoundError:
        return 0


@retried
def _marked(ledger: Ledger) -> list[Cached]:
    q = select(PulledBlob.sha256, Blob.git_oid, Blob.size, PulledBlob.used_at).join(
        Blob, Blob.sha256 == PulledBlob.sha256
    )
    with ledger.session(write=False) as s:
        return [Cached(sha, oid, size, at.replace(tzinfo=UTC).timestamp()) for sha, oid, size, at in s.execute(q)]


@retried
def _unmark(ledger: Ledger, shas: list[str]) -> None:
    with ledger.session() as s:
        for batch in in_batches(shas):
            s.execute(delete(PulledBlob).where(PulledBlob.sha256.in_(batch)))
