"""How a ledger's schema is versioned and migrated: one track per owner of tables.

The resolver owns refs, commits, variants, files, refusals and publishers; the mirror owns its blob
index, what is staged, and serve's tokens. Each keeps its own version table and its own steps, so
neither layer reaches into the other's schema: the resolver knows nothing of the mirror's track, and
`Ledger` migrates whichever tracks its opener names (the mirror's `Home` names its own).

Why an explicit migration table rather than Alembic: the ledger is opened by a CLI on machines that may
have no network; its migrations ship inside the wheel and run on open, with no ini file or script
directory. Every step so far creates tables (`create_all`, which both SQLite and PostgreSQL run the
same) or is a few statements both dialects share. A fresh ledger is created from the models and
stamped with the newest version; an older one runs the missing steps in order, in the opener's
transaction. `create_all` never alters an existing table, so every change after version 1 is an
explicit step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Column, Connection, DateTime, Integer, MetaData, Table, func, inspect, select

from ..errors import HomeReadOnly, LedgerCorrupt


def utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


@dataclass(frozen=True)
class SchemaTrack:
    """One owner's tables, their version, and the steps that bring an older copy up to it.
    `migrations[v]` brings a schema at v-1 to v; `fresh` is what a new ledger gets before its stamp."""

    name: str
    metadata: MetaData
    version: int
    migrations: dict[int, Callable[[Connection], None]]
    version_table: Table

    @classmethod
    def of(
        cls,
        name: str,
        metadata: MetaData,
        version: int,
        table_name: str,
        migrations: dict[int, Callable[[Connection], None]],
    ) -> SchemaTrack:
        table = Table(
            table_name,
            metadata,
            Column("version", Integer, primary_key=True, autoincrement=False),
            Column("applied_at", DateTime, nullable=False),
        )
        return cls(name, metadata, version, migrations, table)


def track_version(conn: Connection, track: SchemaTrack) -> int | None:
    """The track's version in this database; None where it has no version table (a fresh ledger)."""
    if not inspect(conn).has_table(track.version_table.name):
        return None
    return conn.execute(select(func.max(track.version_table.c.version))).scalar() or 0


def migrate(conn: Connection, track: SchemaTrack) -> None:
    """Create the track's tables in a fresh ledger, or bring an older one up to the track's version."""
    current = track_version(conn, track)
    if current is None:
        track.metadata.create_all(conn)  # checkfirst: tables an older layout already holds are kept
        _stamp(conn, track, track.version)
        return
    _check_known(current, track, where="ledger")
    for version in range(current + 1, track.version + 1):
        track.migrations[version](conn)
        _stamp(conn, track, version)
    _check_tables(conn, track, where="ledger")


def check_read_only(conn: Connection, track: SchemaTrack, where: str) -> None:
    """A read-only ledger is read as it is: a migration is a write, so the schema must be this code's."""
    current = track_version(conn, track)
    if current is not None:
        _check_known(current, track, where=where)
    if current == track.version:
        _check_tables(conn, track, where=where)
    if current != track.version:
        raise HomeReadOnly(
            f"{where} {track.name} schema v{current or 0} needs migrating to v{track.version}; "
            "open it once read-write (any frt-mirror command where the home is writable) "
            "to migrate it"
        )


def _check_known(current: int, track: SchemaTrack, where: str) -> None:
    if current < 1:
        raise LedgerCorrupt(f"{where} has a {track.version_table.name} table but no version in it")
    if current > track.version:
        raise LedgerCorrupt(
            f"{where} {track.name} schema v{current} is newer than this frt-mirror understands "
            f"(v{track.version}): upgrade frt-mirror"
        )


def _check_tables(conn: Connection, track: SchemaTrack, where: str) -> None:
    """A ledger at the track's version has every table of it: one dropped by hand (or lost to damage)
    was an OperationalError traceback at its first query ("no such table: staged"), not one line."""
    have = set(inspect(conn).get_table_names())
    if missing := sorted(set(track.metadata.tables) - have):
        raise LedgerCorrupt(
            f"{where} {track.name} schema v{track.version} is missing its table(s) "
            f"{', '.join(missing)} (dropped or damaged): restore the ledger from a backup, or move "
            "it aside and stage or import again"
        )


def _stamp(conn: Connection, track: SchemaTrack, version: int) -> None:
    conn.execute(track.version_table.insert().values(version=version, applied_at=utcnow()))
