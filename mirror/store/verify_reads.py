"""What `verify` reads of the ledger, all before it hashes a byte: every recorded blob, the newest quarantine
event of each, every staged row, each staged variant's files and metadata.json (a model's selected files
too) and the wheels the rows need. Two readers give the same VerifyRecords: the ledger's own (SQLAlchemy:
any ledger, migrated or refused as its open decides) and read_records, with sqlite3 alone under
ledger_file.quick_read (a SQLite ledger at exactly this code's schema), so that a cron's `verify` of a
small home does not spend most of its time importing SQLAlchemy."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from frt.resolver.resolution import FileEntry

from ..event_rows import QUARANTINE, EventRow, read_events
from .blobs import Digest
from .staged import StagedRow, read_staged

if TYPE_CHECKING:
    from frt.resolver.ledger import Ledger

VariantKey = tuple[str, str, str]  # (repo, commit, variant)


@dataclass(frozen=True)
class VerifyRecords:
    blobs: list[Digest]  # every recorded blob, by sha256
    quarantined: dict[str | None, EventRow]  # the newest quarantine event per blob (its ref: the sha256)
    staged: list[StagedRow]  # every staged row, in records.staged_rows' order
    variants: dict[VariantKey, tuple[tuple[FileEntry, ...], dict[str, Any]]]  # each row's: files, metadata.json
    wheels: dict[str, tuple[str, str, str, int]]  # the rows' recorded wheels: (project, version, sha256, size)


def ledger_records(ledger: Ledger) -> VerifyRecords:
    from ..events import events_of
    from .records import all_blobs, staged_rows, wheel_rows

    staged = staged_rows(ledger)
    with ledger.view() as v:
        variants = {key: v.variant(*key) for key in variant_keys(staged)}
    return VerifyRecords(
        all_blobs(ledger),
        {e.ref: e for e in events_of(ledger, QUARANTINE)},
        staged,
        variants,
        wheel_rows(ledger, _needed_wheels(staged)),
    )


def read_records(conn: sqlite3.Connection) -> VerifyRecords | None:
    """ledger_records' answer read with sqlite3, in quick_read's one transaction."""
    staged = read_staged(conn, None)
    if staged is None:
        return None
    needed = _needed_wheels(staged)
    wheels = conn.execute("SELECT filename, project, version, sha256, size FROM wheels ORDER BY filename")
    return VerifyRecords(
        [Digest(*row) for row in conn.execute("SELECT sha256, git_oid, size FROM blobs ORDER BY sha256")],
        {e.ref: e for e in read_events(conn, QUARANTINE)},
        staged,
        {key: _read_variant(conn, *key) for key in variant_keys(staged)},
        {name: (project, version, sha, size) for name, project, version, sha, size in wheels if name in needed},
    )


def variant_keys(rows: Iterable[StagedRow]) -> list[VariantKey]:
    return sorted({(r.repo, r.commit, r.variant) for r in rows})


def _needed_wheels(rows: Iterable[StagedRow]) -> set[str]:
    return {w for r in rows for w in r.wheels}


def _read_variant(
    conn: sqlite3.Connection, repo: str, commit: str, name: str
) -> tuple[tuple[FileEntry, ...], dict[str, Any]]:
    """LedgerView.variant's answer: the files by path, and the parsed metadata.json ({} where there is none)."""
    rows = conn.execute(
        "SELECT v.metadata_json, f.path, f.size, f.git_oid, f.sha256 FROM variants v "
        "JOIN commits c ON v.commit_pk = c.id JOIN repos r ON c.repo_pk = r.id "
        "LEFT OUTER JOIN files f ON f.variant_pk = v.id "
        "WHERE r.repo_id = ? AND c.sha = ? AND v.name = ? ORDER BY f.path",
        (repo, commit, name),
    ).fetchall()
    files = tuple(FileEntry(p, n, oid, h) for _, p, n, oid, h in rows if p is not None)
    return files, json.loads(rows[0][0]) if rows and rows[0][0] else {}
