"""The ledger's tables (SQLAlchemy 2.x typed ORM) and their migrations.

Why an explicit migration table rather than Alembic: the ledger is one SQLite file
inside a user's home, opened by a CLI on machines that may have no network; the
migrations must ship inside the wheel and run on open with no ini files or script
directory. A fresh ledger is created from the models and stamped with the newest
version; an older one runs the missing steps of `MIGRATIONS` in order, each in
its own transaction. `create_all` never alters existing tables, so every change
after version 1 must be an explicit step here.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone

from sqlalchemy import Connection, ForeignKey, Index, String, Text, UniqueConstraint, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


class Base(DeclarativeBase):
    pass


class SchemaVersion(Base):
    __tablename__ = "schema_migrations"
    version: Mapped[int] = mapped_column(primary_key=True)
    applied_at: Mapped[datetime] = mapped_column(default=utcnow)


class Repo(Base):
    __tablename__ = "repos"
    id: Mapped[int] = mapped_column(primary_key=True)
    repo_id: Mapped[str] = mapped_column(String(200), unique=True)
    repo_type: Mapped[str] = mapped_column(String(16), default="kernel")
    endpoint: Mapped[str | None]
    scanned_at: Mapped[datetime | None]


class Ref(Base):
    """A branch or tag as upstream last showed it; `gone` once upstream dropped it."""

    __tablename__ = "refs"
    __table_args__ = (UniqueConstraint("repo_pk", "kind", "name"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    repo_pk: Mapped[int] = mapped_column(ForeignKey("repos.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(8))  # branch | tag
    name: Mapped[str]
    commit_sha: Mapped[str] = mapped_column(String(40))
    first_seen: Mapped[datetime] = mapped_column(default=utcnow)
    last_seen: Mapped[datetime] = mapped_column(default=utcnow)
    gone: Mapped[bool] = mapped_column(default=False)


class Commit(Base):
    """One commit of a repo's history; `depth` orders history (0 = root, first-parent)."""

    __tablename__ = "commits"
    __table_args__ = (UniqueConstraint("repo_pk", "sha"), Index("ix_commits_parent", "repo_pk", "parent_sha"))
    id: Mapped[int] = mapped_column(primary_key=True)
    repo_pk: Mapped[int] = mapped_column(ForeignKey("repos.id", ondelete="CASCADE"))
    sha: Mapped[str] = mapped_column(String(40))
    parent_sha: Mapped[str | None] = mapped_column(String(40))
    depth: Mapped[int]
    date: Mapped[datetime | None]
    title: Mapped[str] = mapped_column(default="")
    # True once the commit's build/ listing is recorded (zero variants is a valid answer).
    scanned: Mapped[bool] = mapped_column(default=False)
    variants: Mapped[list[Variant]] = relationship(
        back_populates="commit", cascade="all, delete-orphan", order_by="Variant.name"
    )


class Variant(Base):
    """A build variant directory at one commit, with its parsed name and metadata.json."""

    __tablename__ = "variants"
    __table_args__ = (UniqueConstraint("commit_pk", "name"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    commit_pk: Mapped[int] = mapped_column(ForeignKey("commits.id", ondelete="CASCADE"))
    name: Mapped[str]
    framework: Mapped[str | None]  # torch | torch-stable-abi | tvm-ffi | noarch; None = unparseable
    framework_version: Mapped[str | None]
    cxx11: Mapped[bool | None]
    backend: Mapped[str | None]
    cpu: Mapped[str | None]
    os: Mapped[str | None]
    metadata_oid: Mapped[str | None] = mapped_column(String(64))
    metadata_json: Mapped[str | None] = mapped_column(Text)
    archs: Mapped[str | None]  # JSON list from metadata backend.archs
    kernel_depends: Mapped[str | None] = mapped_column(Text)  # JSON list
    commit: Mapped[Commit] = relationship(back_populates="variants")
    files: Mapped[list[File]] = relationship(
        back_populates="variant", cascade="all, delete-orphan", order_by="File.path"
    )


class File(Base):
    """A file of a variant: `git_oid` always, `sha256` where upstream advertises it (LFS)."""

    __tablename__ = "files"
    __table_args__ = (UniqueConstraint("variant_pk", "path"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    variant_pk: Mapped[int] = mapped_column(ForeignKey("variants.id", ondelete="CASCADE"))
    path: Mapped[str]  # relative to the repo root: build/<variant>/...
    size: Mapped[int]
    git_oid: Mapped[str] = mapped_column(String(40))
    sha256: Mapped[str | None] = mapped_column(String(64))
    variant: Mapped[Variant] = relationship(back_populates="files")


class RefusalRow(Base):
    """Every distinct refusal: keyed by all of what failed, so two failures never collapse."""

    __tablename__ = "refusals"
    __table_args__ = (UniqueConstraint("repo_id", "requested", "target", "error", "detail"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    repo_id: Mapped[str]
    requested: Mapped[str]  # "version 1", "revision release/v1", "pin 3f2a…"
    version: Mapped[int | None]
    revision: Mapped[str | None]
    target: Mapped[str]
    commit_sha: Mapped[str | None] = mapped_column(String(40))
    error: Mapped[str]  # NoVariant | VersionNotFound | RevisionNotFound | RepoNotFound | ...
    message: Mapped[str] = mapped_column(Text)
    detail: Mapped[str] = mapped_column(Text)  # verbatim: the library's trace or the upstream's text
    count: Mapped[int] = mapped_column(default=1)
    first_seen: Mapped[datetime] = mapped_column(default=utcnow)
    last_seen: Mapped[datetime] = mapped_column(default=utcnow)


class Publisher(Base):
    """An org's `trustedKernelPublisher` as the upstream last answered it: the upstream's word, which
    `serve` repeats and a bundle carries. `kernels` refuses an untrusted publisher's kernel unless
    the caller passes trust_remote_code; the mirror must neither grant nor withdraw that."""

    __tablename__ = "publishers"
    org: Mapped[str] = mapped_column(String(96), primary_key=True)
    trusted: Mapped[bool]
    endpoint: Mapped[str | None]
    seen_at: Mapped[datetime] = mapped_column(default=utcnow)


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


SCHEMA_VERSION = 4


def _v2_store(conn: Connection) -> None:
    """Version 2: the blob store's index and what is staged (new tables only)."""
    Base.metadata.create_all(conn, tables=[Blob.__table__, Staged.__table__])


def _v3_tokens(conn: Connection) -> None:
    """Version 3: bearer tokens for serve."""
    Base.metadata.create_all(conn, tables=[Token.__table__])


def _v4_publishers(conn: Connection) -> None:
    """Version 4: each org's trustedKernelPublisher, recorded from the upstream."""
    Base.metadata.create_all(conn, tables=[Publisher.__table__])


# version -> step that brings a ledger at version-1 up to version; `test_ledger` checks
# that every version after 1 has one.
MIGRATIONS: dict[int, Callable[[Connection], None]] = {2: _v2_store, 3: _v3_tokens, 4: _v4_publishers}


def schema_version(conn: Connection) -> int | None:
    """The ledger's schema version; None for a database with no schema_migrations table (a fresh one)."""
    tables = set(conn.execute(text("SELECT name FROM sqlite_master WHERE type='table'")).scalars())
    if SchemaVersion.__tablename__ not in tables:
        return None
    return conn.execute(text("SELECT max(version) FROM schema_migrations")).scalar() or 0


def migrate(conn: Connection) -> None:
    """Create a fresh ledger, or bring an older one up to `SCHEMA_VERSION`."""
    current = schema_version(conn)
    if current is None:
        Base.metadata.create_all(conn)
        conn.execute(SchemaVersion.__table__.insert().values(version=SCHEMA_VERSION, applied_at=utcnow()))
        return
    from .errors import LedgerCorrupt

    if current < 1:
        raise LedgerCorrupt("ledger has a schema_migrations table but no version in it")
    if current > SCHEMA_VERSION:
        raise LedgerCorrupt(
            f"ledger schema version {current} is newer than this frt-mirror understands ({SCHEMA_VERSION}); upgrade"
        )
    for version in range(current + 1, SCHEMA_VERSION + 1):
        MIGRATIONS[version](conn)
        conn.execute(SchemaVersion.__table__.insert().values(version=version, applied_at=utcnow()))
