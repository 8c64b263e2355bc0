"""A refusal on record as its readers take it (`report`, serve's page), whichever way the ledger was read:
through SQLAlchemy (Ledger.refusals) or with sqlite3 alone (read_refusals, under ledger_file.quick_read)."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, fields
from datetime import datetime


@dataclass(frozen=True)
class RefusalRecord:
    """A refusal on record (schema.RefusalRow's columns), as `report` and serve's page read it."""

    id: int
    repo_id: str
    requested: str
    version: int | None
    revision: str | None
    target: str
    commit_sha: str | None
    error: str
    message: str
    detail: str
    count: int
    first_seen: datetime
    last_seen: datetime


REFUSAL_COLUMNS = [f.name for f in fields(RefusalRecord)]


def read_refusals(conn: sqlite3.Connection) -> list[RefusalRecord]:
    """Every refusal, newest first, as Ledger.refusals orders them."""
    rows = conn.execute(
        f"SELECT {', '.join(REFUSAL_COLUMNS)} FROM refusals ORDER BY last_seen DESC, id DESC"  # noqa: S608
    ).fetchall()
    # The dates are ISO text in SQLite, which SQLAlchemy parses as fromisoformat does.
    return [
        RefusalRecord(
            pk,
            repo,
            requested,
            version,
            revision,
            target,
            commit,
            error,
            message,
            detail,
            count,
            datetime.fromisoformat(first),
            datetime.fromisoformat(last),
        )  # fmt: skip
        for pk, repo, requested, version, revision, target, commit, error, message, detail, count, first, last in rows
    ]
