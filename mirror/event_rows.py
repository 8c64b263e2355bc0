"""An event of the home's log as its readers take it (serve's page, verify), whichever way the ledger was
read: through SQLAlchemy (events.py) or with sqlite3 alone (read_events, under ledger_file.quick_read)."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import datetime

QUARANTINE = "quarantine"  # serve found a stored blob's bytes changed, and set it aside (serve/integrity.py)


@dataclass(frozen=True)
class EventRow:
    kind: str
    at: datetime
    ref: str | None
    base: str | None
    files: int
    nbytes: int
    detail: str


def read_events(conn: sqlite3.Connection, kind: str) -> list[EventRow]:
    """Every event of `kind`, oldest first, as events.events_of reads them."""
    rows = conn.execute(
        "SELECT kind, at, ref, base, files, nbytes, detail FROM mirror_events WHERE kind = ? ORDER BY id", (kind,)
    )
    # The dates are ISO text in SQLite, which SQLAlchemy parses as fromisoformat does.
    return [EventRow(k, datetime.fromisoformat(at), *rest) for k, at, *rest in rows]
