"""The mirror's tables in the ledger, and their migration track (see frt.resolver.ledger.migrations): the
blob store's index, what is staged for which target (and the wheels it needs), and serve's bearer tokens,
the change serial, the events log, the withdrawals and the fleet's demand. Only this package
reads or writes them; the resolver's tables are the resolver's."""

from __future__ import annotations

from datetime import datetime
from typing import cast

from sqlalchemy import Connection, String, Table, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from frt.resolver.ledger.migrations import SchemaTrack, utcnow

from .home_path import MIRROR_VERSION


class Base(DeclarativeBase):
    pass


class Blob(Base):
    """A verified file in the mirror's content-addressed store."""

    __tablename__ = "blobs"
    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    size: Mapped[int]
    git_oid: Mapped[str] = mapped_column(String(40), index=True)  # git blob sha1 of the content
    stored_at: Mapped[datetime] = mapped_column(default=utcnow)


class Staged(Base):
    """A request staged for a target: the commit and variant whose files are in the store and views."""

    __tablename__ = "staged"
    __table_args__ = (UniqueConstraint("repo_id", "requested", "target"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    repo_id: Mapped[str]
    requested: Mapped[str]  # Request.label: "v1", "revision release/v1", "pin 3f2a…"
    version: Mapped[int | None]
    revision: Mapped[str | None]
    target: Mapped[str]
    commit_sha: Mapped[str] = mapped_column(String(40))
    variant: Mapped[str]
    staged_at: Mapped[datetime] = mapped_column(default=utcnow)


class Token(Base):
    """A bearer token for `serve`: only its sha256 is kept; the token itself is shown once."""

    __tablename__ = "tokens"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(unique=True)
    sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Change(Base):
    """One row: a serial bumped by every write that changes what `serve` answers (what is staged, the
    tokens), in that write's transaction. Replicas poll it, one indexed read, and reload on a change."""

    __tablename__ = "mirror_changes"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    serial: Mapped[int]


class Event(Base):
    """One finished piece of work on the home: a stage, a bundle written, an import, a gc. The operator's
    page shows the last of each kind; an incremental bundle's import checks its base was imported here."""

    __tablename__ = "mirror_events"
    id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), index=True)  # "stage", "bundle", "import", "gc", "pull"
    at: Mapped[datetime] = mapped_column(default=utcnow)
    ref: Mapped[str | None] = mapped_column(index=True)  # a bundle's id (sha256 of its manifest), a manifest
    base: Mapped[str | None]  # an incremental bundle's base id
    files: Mapped[int] = mapped_column(default=0)
    nbytes: Mapped[int] = mapped_column(default=0)
    detail: Mapped[str] = mapped_column(default="")  # one line for people


class Wheel(Base):
    """A wheel in the store (its blob is a `blobs` row too): what pip on a cluster installs for a kernel's
    python-depends, linked as views/wheels/<filename>."""

    __tablename__ = "wheels"
    filename: Mapped[str] = mapped_column(String(255), primary_key=True)
    project: Mapped[str] = mapped_column(index=True)  # canonical (PEP 503)
    version: Mapped[str]
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    size: Mapped[int]


class StagedWheel(Base):
    """Which wheels a staged row's variant needs on its target: taken away with the row."""

    __tablename__ = "staged_wheels"
    repo_id: Mapped[str] = mapped_column(primary_key=True)
    requested: Mapped[str] = mapped_column(primary_key=True)
    target: Mapped[str] = mapped_column(primary_key=True)
    filename: Mapped[str] = mapped_column(String(255), primary_key=True)


class Withdrawn(Base):
    """A staged row taken away (unstage, or an incremental bundle's removal), and when, by the clock of the
    box that decided it: a bundle written before then does not bring the row back (bundle/read.py)."""

    __tablename__ = "withdrawn"
    repo_id: Mapped[str] = mapped_column(primary_key=True)
    requested: Mapped[str] = mapped_column(primary_key=True)
    target: Mapped[str] = mapped_column(primary_key=True)
    at: Mapped[datetime]


class Demand(Base):
    """What serve's kernels clients asked for and what it answered, counted per day
    (frt.mirror.serve.demand_records): one row per day x repo x what was asked x target x outcome (x client,
    only with serve --demand-log-clients), never one per request."""

    __tablename__ = "demand"
    day: Mapped[str] = mapped_column(String(10), primary_key=True)  # UTC, "2026-12-03"
    repo_id: Mapped[str] = mapped_column(primary_key=True)
    asked: Mapped[str] = mapped_column(primary_key=True)  # "v2", "revision <sha>", "" (the repo, any version)
    target: Mapped[str] = mapped_column(primary_key=True)  # from the client's User-Agent; "" where it names none
    outcome: Mapped[str] = mapped_column(String(16), primary_key=True)  # demand.OUTCOMES
    client: Mapped[str] = mapped_column(primary_key=True, default="")
    variant: Mapped[str] = mapped_column(default="")  # served: the variant kernels picks from the listing
    count: Mapped[int] = mapped_column(default=0)
    first_seen: Mapped[datetime]
    last_seen: Mapped[datetime]


class PulledBlob(Base):
    """A blob pull-through stored (serve --upstream), and when a client last asked for it as far as serve
    has said (flushed from memory every few seconds, never per request): what serve --cache-max may evict,
    least recently used first (frt.mirror.store.evict). A blob a stage also references is never evicted."""

    __tablename__ = "pulled_blobs"
    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    used_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)


def _v2_changes(conn: Connection) -> None:
    """Version 2: the change serial serve's replicas poll."""
    Base.metadata.create_all(conn, tables=[cast(Table, Change.__table__)])


def _v3_events(conn: Connection) -> None:
    """Version 3: the events the operator's page and incremental bundles read."""
    Base.metadata.create_all(conn, tables=[cast(Table, Event.__table__)])


def _v4_wheels(conn: Connection) -> None:
    """Version 4: the wheels of python-depends, and which staged rows need them."""
    Base.metadata.create_all(conn, tables=[cast(Table, Wheel.__table__), cast(Table, StagedWheel.__table__)])


def _v5_withdrawn(conn: Connection) -> None:
    """Version 5: the rows withdrawn, so that an older bundle's import does not bring them back."""
    Base.metadata.create_all(conn, tables=[cast(Table, Withdrawn.__table__)])


def _v6_demand(conn: Connection) -> None:
    """Version 6: what the fleet asked serve for, and what it could not answer."""
    Base.metadata.create_all(conn, tables=[cast(Table, Demand.__table__)])


def _v7_pulled(conn: Connection) -> None:
    """Version 7: the blobs pull-through stored, and their last use (serve --cache-max)."""
    Base.metadata.create_all(conn, tables=[cast(Table, PulledBlob.__table__)])


# Version 1 is blobs, staged and tokens as the resolver's track created them up to its version 3: a
# ledger from then keeps its rows (create_all skips tables that exist) and is stamped.
MIRROR_TRACK = SchemaTrack.of(
    "mirror",
    Base.metadata,
    MIRROR_VERSION,
    "mirror_schema_migrations",
    {2: _v2_changes, 3: _v3_events, 4: _v4_wheels, 5: _v5_withdrawn, 6: _v6_demand, 7: _v7_pulled},
)
