"""gc: remove the blobs nothing references, their ledger rows, and partial downloads nobody will resume.

A blob is referenced when a staged row's files name it (kernels and models alike, through the ledger's record
of each staged variant) or its wheels do (python-depends), or when a file under the views is a hard link to it
(by inode: a view a stager is still assembling, or one whose staged row was replaced, keeps its blobs).
Everything else in the store is garbage: what `unstage` dropped, what a stage left unreferenced
when it moved a branch to a new commit, blobs an interrupted run stored but never recorded.

gc holds the store's lock exclusively (frt.mirror.store.lock) for the whole run, so it never meets a
stager between storing a blob and recording its reference; each blob is unlinked under the per-blob
lock a download of it takes as well.

Files go before ledger rows, so that gc frees space before it writes anything: it is what an operator runs
on a full disk (issue 49). There the ledger is read read-only (Home.reads_when_full), the garbage and dead
partial downloads removed, and the ledger written once there is room again (Home.writable_again); where
there is still none, its rows wait for the next gc and the report says so. A gc cut short between the two
leaves only records of unreferenced blobs the store no longer holds: nothing reads a blob of the store
without asking the store for it, verify counts them as stale records (not a problem), and the next gc
drops them as it drops any record of a blob lost from the store.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from filelock import Timeout

from frt.resolver.errors import LocalDiskError

from ..events import record_event
from .blobs import Digest
from .home import Home
from .lock import store_collector
from .records import all_blobs, blob_for, delete_blob_records, staged_rows, variant_files, wheel_rows
from .row_records import Key, drop_orphans
from .staged import StagedRow
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
    ledger_deferred: bool = False  # the disk was still full after the removals: the rows wait for the next gc

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
            "ledger_deferred": self.ledger_deferred,
            "kept_blobs": self.kept_blobs,
            "kept_bytes": self.kept_bytes,
        }


def collect(home: Home, *, dry_run: bool = False, on_wait: Callable[[str], None] = lambda what: None) -> GcReport:
    """Remove (or, dry, only list) what `plan` finds, holding the store's lock for the whole run: the files
    first, then their ledger rows (the module's docstring says why)."""
    home.reads_when_full = True
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
            removed = free_files(home, p)
            report.parts = [x for x in report.parts if x.name in removed]
            report.ledger_deferred = not record_removal(home, p, report)
    return report


def free_files(home: Home, p: Plan) -> set[str]:
    """Remove the garbage blobs and dead partial downloads of `p`: the space gc frees, before any write.
    The names of the parts removed (a live download's stays)."""
    for d in p.garbage:
        home.store.remove(d.sha256, *([d.git_oid] if d.git_oid else []))
    return {part.name for part in p.parts if _remove_part(home, part)}


def record_removal(home: Home, p: Plan, report: GcReport) -> bool:
    """The ledger rows of what `free_files` removed, and gc's event; False where the disk is still too full
    to write them (a write that fills it as well): they wait for the next gc, which finds the same."""
    if not home.writable_again():
        return False
    try:
        delete_blob_records(home.ledger, [d.sha256 for d in p.garbage] + p.stale_records)
        record_event(
            home.ledger,
            "gc",
            files=len(report.removed),
            nbytes=report.removed_bytes,
            detail=f"{len(report.parts)} partial download(s), {report.part_bytes} bytes",
        )
    except LocalDiskError:
        return False
    return True


def plan(home: Home, without: frozenset[Key] = frozenset()) -> Plan:
    """What gc would remove now, or once the staged rows keyed `without` are gone (unstage on a full disk).
    Takes no lock: `collect` calls it under the store's lock."""
    ledger, store = home.ledger, home.store
    cutoff = time.time() - SWEEP_AGE_S
    every = staged_rows(ledger)
    rows = [r for r in every if r.key not in without]
    referenced, unresolved = _recorded_references(home, rows)
    needed_wheels = {w for r in rows for w in r.wheels}
    referenced |= {sha for _, _, sha, _ in wheel_rows(ledger, needed_wheels).values()}
    folder = wheels_dir(home.root)
    wheel_links = sorted(p for p in folder.glob("*.whl") if p.name not in needed_wheels) if folder.is_dir() else []
    linked: set[tuple[int, int]] = set()
    if (views := home.views) is not None:
        # The views that the rows `without` alone need go with them (unstage.drop_views): their links don't count.
        still = {views.variant_dir(r.repo, r.commit, r.variant) for r in rows}
        going = {views.variant_dir(r.repo, r.commit, r.variant) for r in every if r.key in without} - still
        linked = _linked_inodes(views, cutoff, going)
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
    # On a full disk a dead run's part of any age goes (_remove_part skips a live one): its bytes are worth
    # more than resuming it, and a stage stopped by the full disk left it moments ago.
    young = float("inf") if home.full else cutoff
    parts = sorted(p for p in tmp.glob("*.part") if _mtime(p) < young) if tmp.is_dir() else []
    return Plan(garbage, stale, kept, parts, wheel_links)


def _recorded_references(home: Home, rows: list[StagedRow]) -> tuple[set[str], set[str]]:
    """The sha256 of every blob the files of `rows` name, and the git oids of their small files
    that no recorded blob answers for."""
    ledger = home.ledger
    keys = sorted({(r.repo, r.commit, r.variant) for r in rows})
    blobs = blob_for(ledger, variant_files(ledger, keys))
    return {sha for sha in blobs.values() if sha}, {f.git_oid for f, sha in blobs.items() if sha is None}


def _linked_inodes(views: Views, cutoff: float, going: set[Path]) -> set[tuple[int, int]]:
    """Every file under the views, as (device, inode): hard links into the store. Scratch dirs older
    than the sweep age are dead stagers' and do not count (gc sweeps them), nor do the `going` views."""
    roots = [views.root]
    if views.tmp.is_dir():
        roots += [p for p in views.tmp.iterdir() if _mtime(p) >= cutoff]
    out = set()
    for root in roots:
        for dirpath, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if Path(dirpath, d) not in going]
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


def _remove_part(home: Home, path: Path) -> bool:
    """Under the lock its download takes (named by the key before the first dot), and only if still
    untouched for the sweep age: a resumed download would have written to it. On a full disk (plan took
    parts of any age), only one whose lock is free now: a download holds it while it writes."""
    key = path.name.split(".", 1)[0]
    if home.full:
        with contextlib.suppress(Timeout), home.store.scratch.lock(key, wait=False):
            path.unlink(missing_ok=True)
            return True
        return False
    with home.store.scratch.lock(key):
        if _mtime(path) < time.time() - SWEEP_AGE_S:
            path.unlink(missing_ok=True)
            return True
    return False
