"""gc: remove the blobs nothing references, their ledger rows, and partial downloads nobody will resume.

A blob is referenced when a staged row's files name it (kernels and models alike, through the ledger's record
of each staged variant) or its wheels do (python-depends), or when a file under the views is a hard link to it
(by inode: a view a stager is still assembling, or one whose staged row was replaced, keeps its blobs).
Everything else in the store is garbage: what `unstage` dropped, what a stage left unreferenced
when it moved a branch to a new commit, blobs an interrupted run stored but never recorded.

gc holds the store's lock exclusively (frt.mirror.store.lock) for the whole run, so it never meets a
stager between storing a blob and recording its reference; each blob is unlinked under the per-blob
lock a download of it takes as well. Ledger rows go before files: a gc cut short leaves at most an
unrecorded blob (which verify adopts and the next gc removes), never a record of missing bytes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from frt.resolver.ledger import Ledger
from frt.resolver.ledger.retry import retried
from frt.resolver.resolution import FileEntry

from ..events import record_event
from .blobs import Digest
from .home import Home
from .lock import store_collector
from .records import all_blobs, blob_for, delete_blob_records, staged_rows, wheel_rows
from .row_records import drop_orphans
from .view_trees import Views, wheels_dir

# As Scratch.sweep_parts and Views.sweep_tmp: older than any live writer's (a download in flight
# touches its .part with every chunk; a view being assembled is renamed into place within seconds).
SWEEP_AGE_S = 600.0


@dataclass(frozen=True)
class Part:
    name: str
    size: int


@dataclass(frozen=True)
class Plan:
    garbage: list[Digest]  # in the store, unreferenced (git_oid "" where the ledger has no record)
    stale_records: list[str]  # recorded, unreferenced, and not in the store
    kept: list[Digest]
    parts: list[Path]
    wheel_links: list[Path] = field(default_factory=list)  # views/wheels/ entries no staged row needs


@dataclass
class GcReport:
    dry_run: bool
    removed: list[Digest] = field(default_factory=list)
    parts: list[Part] = field(default_factory=list)
    kept_blobs: int = 0
    kept_bytes: int = 0
    dropped_records: int = 0  # ledger rows of unreferenced blobs the store did not have

    @property
    def removed_bytes(self) -> int:
        return sum(d.size for d in self.removed)

    @property
    def part_bytes(self) -> int:
        return sum(p.size for p in self.parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "removed_blobs": len(self.removed),
            "removed_bytes": self.removed_bytes,
            "blobs": [{"sha256": d.sha256, "size": d.size} for d in self.removed],
            "removed_parts": len(self.parts),
            "part_bytes": self.part_bytes,
            "parts": [{"name": p.name, "size": p.size} for p in self.parts],
            "dropped_records": self.dropped_records,
            "kept_blobs": self.kept_blobs,
            "kept_bytes": self.kept_bytes,
        }


def collect(home: Home, *, dry_run: bool = False, on_wait: Callable[[str], None] = lambda what: None) -> GcReport:
    """Remove (or, dry, only list) what `plan` finds, holding the store's lock for the whole run."""
    with store_collector(home, on_wait):
        if not dry_run and (views := home.views) is not None:
            views.sweep_tmp(SWEEP_AGE_S)  # dead stagers' scratch: plan ignores it already
        p = plan(home)
        report = GcReport(
            dry_run,
            p.garbage,
            [_part(x) for x in p.parts],
            len(p.kept),
            sum(d.size for d in p.kept),
            len(p.stale_records),
        )
        if not dry_run:
            for link in p.wheel_links:  # first: pip on a shared home never finds a wheel whose blob is gone
                link.unlink(missing_ok=True)
            drop_orphans(home.store, (r.key for r in staged_rows(home.ledger)))
            delete_blob_records(home.ledger, [d.sha256 for d in p.garbage] + p.stale_records)
            for d in p.garbage:
                home.store.remove(d.sha256, *([d.git_oid] if d.git_oid else []))
            for part in p.parts:
                _remove_part(home, part)
            record_event(
                home.ledger,
                "gc",
                files=len(report.removed),
                nbytes=report.removed_bytes,
                detail=f"{len(report.parts)} partial download(s), {report.part_bytes} bytes",
            )
    return report


def plan(home: Home) -> Plan:
    """What gc would remove now. Takes no lock: `collect` calls it under the store's lock."""
    ledger, store = home.ledger, home.store
    cutoff = time.time() - SWEEP_AGE_S
    referenced, unresolved = _recorded_references(home)
    needed_wheels = {w for r in staged_rows(ledger) for w in r.wheels}
    referenced |= {sha for _, _, sha, _ in wheel_rows(ledger, needed_wheels).values()}
    folder = wheels_dir(home.root)
    wheel_links = sorted(p for p in folder.glob("*.whl") if p.name not in needed_wheels) if folder.is_dir() else []
    linked = _linked_inodes(views, cutoff) if (views := home.views) is not None else set()
    recorded = {d.sha256: d for d in all_blobs(ledger)}
    garbage, kept, on_disk = [], [], set()
    for sha, size, inode in store.blob_stats():
        rec = recorded.get(sha)
        on_disk.add(sha)
        digest = Digest(sha, rec.git_oid if rec else "", size)
        # A small file is known to its staged row only by git oid; unrecorded, only its bytes say which.
        by_bytes = rec is None and unresolved and store.digest(sha).git_oid in unresolved
        if sha in referenced or inode in linked or by_bytes:
            kept.append(digest)
        else:
            garbage.append(digest)
    stale = sorted(sha for sha in recorded if sha not in on_disk and sha not in referenced)
    tmp = store.scratch.tmp
    parts = sorted(p for p in tmp.glob("*.part") if _mtime(p) < cutoff) if tmp.is_dir() else []
    return Plan(garbage, stale, kept, parts, wheel_links)


def _recorded_references(home: Home) -> tuple[set[str], set[str]]:
    """The sha256 of every blob a staged row's files name, and the git oids of staged small files
    that no recorded blob answers for."""
    ledger = home.ledger
    keys = sorted({(r.repo, r.commit, r.variant) for r in staged_rows(ledger)})
    blobs = blob_for(ledger, _variant_files(ledger, keys))
    return {sha for sha in blobs.values() if sha}, {f.git_oid for f, sha in blobs.items() if sha is None}


@retried
def _variant_files(ledger: Ledger, keys: list[tuple[str, str, str]]) -> list[FileEntry]:
    with ledger.view() as v:
        return [f for key in keys for f in v.variant(*key)[0]]


def _linked_inodes(views: Views, cutoff: float) -> set[tuple[int, int]]:
    """Every file under the views, as (device, inode): hard links into the store. Scratch dirs older
    than the sweep age are dead stagers' and do not count (gc sweeps them)."""
    roots = [views.root]
    if views.tmp.is_dir():
        roots += [p for p in views.tmp.iterdir() if _mtime(p) >= cutoff]
    out = set()
    for root in roots:
        for dirpath, _dirs, names in os.walk(root):
            for name in names:
                try:
                    st = os.stat(os.path.join(dirpath, name))
                except FileNotFoundError:
                    continue
                out.add((st.st_dev, st.st_ino))
    return out


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return float("inf")  # gone: nothing to count or remove


def _part(path: Path) -> Part:
    try:
        return Part(path.name, path.stat().st_size)
    except FileNotFoundError:
        return Part(path.name, 0)


def _remove_part(home: Home, path: Path) -> None:
    """Under the lock its download takes (named by the key before the first dot), and only if still
    untouched for the sweep age: a resumed download would have written to it."""
    with home.store.scratch.lock(path.name.split(".", 1)[0]):
        if _mtime(path) < time.time() - SWEEP_AGE_S:
            path.unlink(missing_ok=True)
