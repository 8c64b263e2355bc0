"""ledger rebuild: the ledger again from the records the store holds beside the blobs (store/row_records.py),
offline.

Each record is a bundle's manifest of one staged row, or a tombstone of a withdrawn one. Every record is read
and checked (by the bundle's own reader, bundle/check.py) and every blob each names is looked for in the
store with its size, before anything is written: a record that does not hold is one line, and the ledger is
left as it was. Hashing the blobs is `verify`'s work, not this: a rebuild reads the store's listing, not its
bytes, so it takes seconds where verify takes as long as reading every blob. Then every row goes into the
ledger in one transaction, by the rules an import merges a bundle with (newest upstream answer wins for refs
and publishers), and the views are laid out where they are missing.

What is not rebuilt, because the store never held it: serve's tokens (only their hashes were in the ledger:
the operator adds tokens again, and until then serve is open to every client), the refusals (`report`: the
next stage records them again), the events log and the fleet's demand counts.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from frt.resolver.errors import BadInput, Refused, VerificationFailed
from frt.resolver.ledger import Ledger
from frt.resolver.ledger.schema import Base as ResolverBase
from frt.resolver.resolution import FileEntry

from ..events import record_event
from ..schema import MIRROR_TRACK
from ..schema import Base as MirrorBase
from ..store.blobs import Digest
from ..store.home import Home, ledger_is_empty
from ..store.records import record_blobs, record_staged_rows
from ..store.withdrawn import record_withdrawn
from .check import Manifest, check_manifest
from .merge import merge_manifest

NOT_REBUILT = "tokens, refusals, events and demand are not rebuilt (token add again: serve is open until then)"


@dataclass
class RebuildReport:
    records: int = 0
    rows: int = 0  # staged rows rebuilt
    withdrawn: int = 0  # tombstones: rows unstaged, remembered as withdrawn
    repos: int = 0
    blobs: int = 0
    bytes: int = 0
    views: int = 0  # views laid out again (a filesystem store's)
    staged: list[dict[str, Any]] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"rebuilt the ledger from {self.records} record(s): {self.rows} staged row(s) of {self.repos} repo(s), "
            f"{self.withdrawn} withdrawn, {self.blobs} blob(s) ({self.bytes} bytes) present"
            + (f", {self.views} view(s) laid out again" if self.views else "")
            + f"; {NOT_REBUILT}"
        )

    def to_json(self) -> dict[str, Any]:
        return {"ok": True, **self.__dict__, "not_rebuilt": ["tokens", "refusals", "events", "demand"]}


@dataclass
class _Read:
    manifests: list[tuple[str, Manifest]] = field(default_factory=list)  # (record name, manifest), oldest first
    withdrawn: list[tuple[tuple[str, str, str], datetime]] = field(default_factory=list)


def rebuild(home: Home, *, force: bool = False, on_progress: Callable[[int, int], None] | None = None) -> RebuildReport:
    """Make `home`'s ledger again from its store's records. Refused where the ledger is not empty, unless
    `force` (which keeps nothing of it); refused, with nothing written, where a record or a blob fails."""
    store = home.store
    names = store.record_names()
    if not names:
        raise BadInput(
            f"the store {store.where} holds no ledger records (stage, import and pull-through write them beside "
            "the blobs): there is nothing to rebuild from"
        )
    read = _read(home, names, on_progress)
    sizes = {sha: size for sha, size, _ in store.blob_stats()}
    for name, m in read.manifests:
        for d in m.listed.values():
            if sizes.get(d.sha256) != d.size:
                held = "does not hold it" if d.sha256 not in sizes else f"holds {sizes[d.sha256]} bytes of it"
                raise VerificationFailed(
                    f"record {name} ({_rows_of(m)}) names blob {d.sha256} of {d.size} bytes and the store "
                    f"{store.where} {held}: nothing was written (stage or import that row again, or remove the record)"
                )
    # Only now, every record checked: opening a SQLite ledger creates it.
    ledger = home.ledger  # home.rebuilding: the empty ledger is opened (created, migrated), not refused
    if not force and not ledger_is_empty(ledger):
        raise Refused(
            f"ledger {ledger.where} is not empty: ledger rebuild writes only an empty one "
            "(--force drops everything in it first)"
        )
    laid = _lay_out_views(home, read)
    report = ledger.retrying(_write, ledger, read, force)
    report.records, report.views = len(names), laid
    return report


def _lay_out_views(home: Home, read: _Read) -> int:
    """The views of the rows to rebuild that are missing (lost with the ledger), before any row names them,
    as an import lays them out: a rebuild cut short after this leaves only files. How many were laid out."""
    views, laid = home.views, 0
    if views is None:  # an object store's home has none
        return 0
    for _, m in read.manifests:
        for row, pairs in m.staged:
            files = _whole(pairs or [])
            if not row.is_model and not views.is_complete(row.repo, row.commit, files):
                views.link(row.repo, row.commit, row.variant, files)
                laid += 1
        views.link_wheels(m.wheels)
    return laid


def _whole(pairs: list[tuple[FileEntry, str | None]]) -> list[tuple[FileEntry, str]]:
    """A full bundle's pairs, every one with its blob (check_manifest refused any without)."""
    return [(f, sha) for f, sha in pairs if sha is not None]


def _rows_of(m: Manifest) -> str:
    return ", ".join(f"{r.repo} {r.requested} {r.target}" for r, _ in m.staged)


def _read(home: Home, names: list[str], on_progress: Callable[[int, int], None] | None) -> _Read:
    out = _Read()
    dated: list[tuple[datetime | None, str, Manifest]] = []
    for i, name in enumerate(names):
        if on_progress is not None:
            on_progress(i + 1, len(names))
        try:
            doc = json.loads(home.store.read_record(name))
            if "withdrawn" in doc:
                w = doc["withdrawn"]
                key = (str(w["repo"]), str(w["requested"]), str(w["target"]))
                out.withdrawn.append((key, datetime.fromisoformat(w["at"])))
                continue
            m = check_manifest(doc)
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
            raise VerificationFailed(
                f"record {name} in the store {home.store.where} is not a ledger record ({type(e).__name__}: {e}): "
                "nothing was written"
            ) from None
        if m.base is not None or len(m.staged) != 1:
            raise VerificationFailed(f"record {name} is not one staged row's record: nothing was written")
        dated.append((m.created, name, m))
    dated.sort(key=lambda t: (t[0] is not None, t[0] and t[0].replace(tzinfo=None), t[1]))
    out.manifests = [(name, m) for _, name, m in dated]
    return out


def _write(ledger: Ledger, read: _Read, force: bool) -> RebuildReport:
    """Every row in one transaction: a failure leaves the ledger as it was (empty)."""
    report = RebuildReport()
    with ledger.transaction() as s:
        if force:  # keeps nothing: every table of both tracks emptied, their versions kept
            versions = {MIRROR_TRACK.version_table.name, "schema_migrations"}
            for meta in (MirrorBase.metadata, ResolverBase.metadata):
                for table in reversed(meta.sorted_tables):
                    if table.name not in versions:
                        s.execute(table.delete())
        blobs: dict[str, Digest] = {}
        for _, m in read.manifests:
            blobs.update(m.listed)
        record_blobs(ledger, blobs.values())
        repos: set[str] = set()
        for _, m in read.manifests:  # oldest first: merge_repo_record keeps the newest upstream answer
            merge_manifest(ledger, m)
            repos.update(repo.repo for repo in m.repos)
        rows = [row for _, m in read.manifests for row, _ in m.staged]
        record_staged_rows(ledger, rows, store=None)  # the records are there: they are what this read
        for key, at in read.withdrawn:
            record_withdrawn(s, [key], at)
        record_event(ledger, "rebuild", files=len(blobs), nbytes=sum(d.size for d in blobs.values()))
    report.rows, report.withdrawn, report.repos = len(rows), len(read.withdrawn), len(repos)
    report.blobs, report.bytes = len(blobs), sum(d.size for d in blobs.values())
    report.staged = [r.to_json() for r in rows]
    return report
