"""The resolver's tables in the ledger (SQLAlchemy 2.x typed ORM) and their migration track: what
upstream has (repos, refs, commits, the upstream's commit listings, variants, files), every refusal,
and each org's publisher trust. The mirror's tables are the mirror's own (frt.mirror.schema); see
migrations.py for how each track is versioned.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import cast

from sqlalchemy import Connection, ForeignKey, String, Table, Text, UniqueConstraint, select, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from .. import ledger_file
from ..resolution import parent_chain
from .migrations import SchemaTrack, utcnow


class Base(DeclarativeBase):
    pass


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
    """One commit the upstream listed. The Hub's commit list names no parents, so none is claimed:
    `depth` is the commit's place in the first listing that named it, counted from that listing's
    oldest end (an order for display; -1: known only from a build listing). Which commits a head
    reaches is `Listing`'s."""

    __tablename__ = "commits"
    __table_args__ = (UniqueConstraint("repo_pk", "sha"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    repo_pk: Mapped[int] = mapped_column(ForeignKey("repos.id", ondelete="CASCADE"))
    sha: Mapped[str] = mapped_column(String(40))
    depth: Mapped[int]
    date: Mapped[datetime | None]
    title: Mapped[str] = mapped_column(default="")
    # True once the commit's build/ listing is recorded (zero variants is a valid answer).
    scanned: Mapped[bool] = mapped_column(default=False)
    variants: Mapped[list[Variant]] = relationship(
        back_populates="commit", cascade="all, delete-orphan", order_by="Variant.name"
    )


class Listing(Base):
    """What the upstream listed as a head's history (`list_repo_commits(revision=head)`), in its order:
    position 0 is the head. Across merges that order is the Hub's (by date), not a parent chain, so the
    listing is read as a set of reachable commits plus an order, never as parent links."""

    __tablename__ = "listings"
    repo_pk: Mapped[int] = mapped_column(ForeignKey("repos.id", ondelete="CASCADE"), primary_key=True)
    head: Mapped[str] = mapped_column(String(40), primary_key=True)
    position: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    sha: Mapped[str] = mapped_column(String(40))


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


SCHEMA_VERSION = ledger_file.SCHEMA_VERSION  # kept there, where a quick read checks it without SQLAlchemy


def _moved_to_mirror(conn: Connection) -> None:
    """Versions 2 and 3 created the blob index, the staged table and tokens. Those are the mirror's
    tables now, created by its own track (which keeps them where an older ledger has them)."""


def _v4_publishers(conn: Connection) -> None:
    """Version 4: each org's trustedKernelPublisher, recorded from the upstream."""
    Base.metadata.create_all(conn, tables=[cast(Table, Publisher.__table__)])  # a mapped class's: a Table


def _v5_listings(conn: Connection) -> None:
    """Version 5: commits stop claiming parents. Until now a commit's parent was the next entry of the
    upstream's list, which is wrong across merges. Each live ref's head gets the listing the old
    chain gave it (the order the upstream listed it in); the parent column goes."""
    listings = cast(Table, Listing.__table__)  # a mapped class's: a Table
    Base.metadata.create_all(conn, tables=[listings])
    parents: dict[int, dict[str, str | None]] = {}
    for pk, sha, parent in conn.execute(text("SELECT repo_pk, sha, parent_sha FROM commits")):
        parents.setdefault(pk, {})[sha] = parent
    heads = set(conn.execute(select(Ref.repo_pk, Ref.commit_sha).where(~Ref.gone)).all())
    rows = [
        {"repo_pk": pk, "head": head, "position": i, "sha": sha}
        for pk, head in heads
        for i, sha in enumerate(parent_chain(parents.get(pk, {}), head))
    ]
    if rows:
        conn.execute(listings.insert(), rows)
    conn.execute(text("DROP INDEX IF EXISTS ix_commits_parent"))
    conn.execute(text("ALTER TABLE commits DROP COLUMN parent_sha"))


# version -> step that brings a ledger at version-1 up to version; `test_ledger` checks that every
# version after 1 has one.
MIGRATIONS: dict[int, Callable[[Connection], None]] = {
    2: _moved_to_mirror,
    3: _moved_to_mirror,
    4: _v4_publishers,
    5: _v5_listings,
}

RESOLVER_TRACK = SchemaTrack.of("resolver", Base.metadata, SCHEMA_VERSION, "schema_migrations", MIGRATIONS)
