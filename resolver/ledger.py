"""The SQLite ledger: what upstream has (refs, history, variants, files) and every refusal.

WAL mode and a busy timeout let several processes (two stagers, a server) share one
home; every write is one short transaction. Reads go through `LedgerView`, bound to
one session, which is the availability provider the resolver core consumes. A ledger
this process cannot write (a read-only home) is opened read-only: see ledger_open.py.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from sqlalchemy import Connection, bindparam, delete, func, select, update
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DatabaseError
from sqlalchemy.orm import Session, sessionmaker

from .errors import FrtError, HomeReadOnly, LedgerCorrupt, LedgerUnavailable, first_line
from .ledger_open import (BUSY_TIMEOUT_MS, WRITING, cannot_write, check_read_only_schema, read_only_engine,
                          read_write_engine)
from .resolution import CommitInfo, FileEntry, Refusal, VariantInfo
from .schema import Commit, File, Publisher, Ref, RefusalRow, Repo, Variant, migrate, utcnow
from .variants import parse_fields


@dataclass(frozen=True)
class CommitRow:
    sha: str
    date: datetime | None
    title: str
    scanned: bool
    variants: list[str]
    no_digest: list[str] = field(default_factory=list)  # variants whose metadata.json has no publisher digest


@dataclass(frozen=True)
class PublisherInfo:
    org: str
    trusted: bool
    endpoint: str | None
    seen_at: datetime

    def to_json(self) -> dict:
        return {"org": self.org, "trusted": self.trusted, "endpoint": self.endpoint,
                "seen_at": self.seen_at.isoformat()}


class Ledger:
    """`readonly`: open it read-only (no migration, no journal-mode change, no write); None: read-only
    exactly when this process cannot write it (a read-only home)."""

    def __init__(self, path: Path | str, readonly: bool | None = None):
        self.path = Path(path)
        self.readonly = cannot_write(self.path) if readonly is None else readonly
        self.engine = None
        try:
            self.engine = read_only_engine(self.path) if self.readonly else read_write_engine(self.path)
            self._sessions = sessionmaker(self.engine, expire_on_commit=False)
            if self.readonly:
                with self.engine.connect() as conn:
                    check_read_only_schema(conn, self.path)
            else:
                with self.write(failure="cannot be opened") as conn:
                    migrate(conn)
        except (FrtError, DatabaseError, sqlite3.DatabaseError) as e:
            if self.engine is not None:
                self.engine.dispose()
            if isinstance(e, FrtError):
                raise
            raise LedgerCorrupt(f"ledger {self.path} cannot be opened: {first_line(e)}") from None

    def close(self) -> None:
        self.engine.dispose()

    def _check_writable(self) -> None:
        if self.readonly:
            raise HomeReadOnly(f"ledger {self.path} is open read-only (its home is read-only here) and this "
                               "writes to it: run it where the home is writable")

    @contextmanager
    def write(self, failure: str = "is unreadable") -> Iterator[Connection]:
        """One write transaction, begun IMMEDIATE: it takes the write lock up front (waiting up to
        the busy timeout), so two processes never both read, then collide on upgrading to write."""
        self._check_writable()
        token = WRITING.set(True)
        try:
            with self._unreadable_as_corrupt(failure), self.engine.begin() as conn:
                yield conn
        finally:
            WRITING.reset(token)

    @contextmanager
    def session(self, write: bool = True) -> Iterator[Session]:
        """An ORM session in one transaction: IMMEDIATE (as `write`) unless `write=False`, for reads
        that must not queue behind, or hold up, a stager's writes."""
        if write:
            self._check_writable()
        token = WRITING.set(write)
        try:
            with self._unreadable_as_corrupt(), self._sessions() as s, s.begin():
                yield s
        finally:
            WRITING.reset(token)

    @contextmanager
    def view(self) -> Iterator[LedgerView]:
        """A read snapshot on a plain connection: no ORM session on the resolve hot path."""
        with self._unreadable_as_corrupt(), self.engine.connect() as conn, conn.begin():
            yield LedgerView(conn)

    @contextmanager
    def _unreadable_as_corrupt(self, failure: str = "is unreadable") -> Iterator[None]:
        try:
            yield
        except (DatabaseError, sqlite3.DatabaseError) as e:
            orig = getattr(e, "orig", e)
            if isinstance(orig, sqlite3.OperationalError) and "locked" in str(orig):
                raise LedgerUnavailable(f"ledger {self.path} is locked by another process past the "
                                        f"{BUSY_TIMEOUT_MS // 1000} s busy timeout: try again later") from None
            if isinstance(orig, (sqlite3.IntegrityError, sqlite3.OperationalError)):
                raise  # a constraint is a bug, not a corrupt file
            raise LedgerCorrupt(f"ledger {self.path} {failure}: {first_line(e)}") from None

    # -- writes -------------------------------------------------------------------------

    def record_refs(self, repo_id: str, refs: dict[tuple[str, str], str], *, endpoint: str | None,
                    repo_type: str = "kernel") -> None:
        """Record upstream's refs {(kind, name): sha}; refs it no longer has are marked gone."""
        now = utcnow()
        with self.session() as s:
            repo = _repo(s, repo_id, repo_type=repo_type, endpoint=endpoint)
            existing = {(r.kind, r.name): r for r in s.scalars(select(Ref).where(Ref.repo_pk == repo.id))}
            for key, sha in refs.items():
                row = existing.pop(key, None)
                if row is None:
                    s.add(Ref(repo_pk=repo.id, kind=key[0], name=key[1], commit_sha=sha, first_seen=now, last_seen=now))
                else:
                    row.commit_sha, row.last_seen, row.gone = sha, now, False
            for row in existing.values():
                row.gone = True
            repo.scanned_at = now

    def record_history(self, repo_id: str, history: list[CommitInfo]) -> None:
        """Record a first-parent history, newest first, as returned by list_repo_commits."""
        with self.session() as s:
            repo = _repo(s, repo_id)
            known = {c.sha: c for c in s.scalars(select(Commit).where(Commit.repo_pk == repo.id))}
            for depth, c in enumerate(reversed(history)):
                row = known.get(c.sha)
                if row is None:
                    known[c.sha] = Commit(repo_pk=repo.id, sha=c.sha, parent_sha=c.parent, depth=depth,
                                          date=c.date, title=c.title)
                    s.add(known[c.sha])
                elif row.depth < 0:  # recorded by record_build before its history was known
                    row.parent_sha, row.depth, row.date, row.title = c.parent, depth, c.date, c.title

    def record_builds(self, repo_id: str, builds: dict[str, list[VariantInfo]]) -> None:
        """Record the build/ listings of commits {sha: variants}, in one transaction."""
        with self.session() as s:
            repo = _repo(s, repo_id)
            rows = {c.sha: c for c in s.scalars(select(Commit).where(Commit.repo_pk == repo.id,
                                                                     Commit.sha.in_(list(builds))))}
            for sha, variants in builds.items():
                commit = rows.get(sha)
                if commit is None:
                    commit = Commit(repo_pk=repo.id, sha=sha, parent_sha=None, depth=-1, date=None, title="")
                    s.add(commit)
                    s.flush()
                s.execute(delete(Variant).where(Variant.commit_pk == commit.id))
                s.add_all(_variant_row(commit.id, v) for v in variants)
                commit.scanned = True

    def record_refusal(self, refusal: Refusal) -> None:
        """One upsert on the refusal's full key: a repeat counts, a different failure is a new row."""
        if self.readonly:  # a read-only home keeps no record; the caller still gets the refusal itself
            return
        r, now = refusal, utcnow()
        with self.write() as conn:
            conn.execute(_UPSERT_REFUSAL, {
                "repo_id": r.repo, "requested": r.request.label, "target": str(r.target), "error": r.error,
                "detail": r.detail, "version": r.request.version, "revision": r.request.revision,
                "commit_sha": r.commit, "message": r.message, "count": 1, "first_seen": now, "last_seen": now,
            })

    def record_publisher(self, org: str, trusted: bool, *, endpoint: str | None,
                         seen_at: datetime | None = None) -> None:
        """The upstream's trustedKernelPublisher for `org` (a later answer replaces an earlier one;
        an import keeps the newer of its own and the bundle's)."""
        seen = seen_at or utcnow()
        with self.session() as s:
            row = s.get(Publisher, org)
            if row is None:
                s.add(Publisher(org=org, trusted=trusted, endpoint=endpoint, seen_at=seen))
            elif row.seen_at <= seen:
                row.trusted, row.endpoint, row.seen_at = trusted, endpoint, seen

    def publishers(self, orgs: set[str] | None = None) -> dict[str, PublisherInfo]:
        with self.session(write=False) as s:
            q = select(Publisher)
            if orgs is not None:
                q = q.where(Publisher.org.in_(orgs))
            return {p.org: PublisherInfo(p.org, p.trusted, p.endpoint, p.seen_at) for p in s.scalars(q)}

    def known_metadata(self, oids: set[str]) -> dict[str, dict]:
        """metadata.json contents already recorded, by git oid: identical files are not refetched."""
        if not oids:
            return {}
        with self.session(write=False) as s:
            rows = s.execute(select(Variant.metadata_oid, Variant.metadata_json)
                             .where(Variant.metadata_oid.in_(oids), Variant.metadata_json.is_not(None))
                             .distinct())
            return {oid: json.loads(doc) for oid, doc in rows}

    def unscanned_commits(self, repo_id: str) -> list[str]:
        with self.session(write=False) as s:
            return list(s.scalars(select(Commit.sha).join(Repo).where(Repo.repo_id == repo_id, ~Commit.scanned)
                                  .order_by(Commit.depth.desc())))

    def refusals(self) -> list[RefusalRow]:
        with self.session(write=False) as s:
            return list(s.scalars(select(RefusalRow).order_by(RefusalRow.last_seen.desc(), RefusalRow.id.desc())))

    def repos(self) -> list[str]:
        with self.session(write=False) as s:
            return list(s.scalars(select(Repo.repo_id).order_by(Repo.repo_id)))


# The view's queries, built once: constructing a select() costs more than running it here.
_REPO_REFS = (select(Repo.id, Ref.kind, Ref.name, Ref.commit_sha)
              .outerjoin(Ref, (Ref.repo_pk == Repo.id) & ~Ref.gone)
              .where(Repo.repo_id == bindparam("repo")).order_by(Ref.kind, Ref.name))
_SHA_PREFIX = (select(Commit.sha).where(Commit.repo_pk == bindparam("pk"),
                                        Commit.sha.startswith(bindparam("prefix"))).limit(2))
_VARIANT_NAMES = (select(Commit.scanned, Variant.name).outerjoin(Variant, Variant.commit_pk == Commit.id)
                  .where(Commit.repo_pk == bindparam("pk"), Commit.sha == bindparam("sha")).order_by(Variant.name))
_VARIANT_FILES = (select(Variant.metadata_json, File.path, File.size, File.git_oid, File.sha256)
                  .join(Commit, Variant.commit_pk == Commit.id).outerjoin(File, File.variant_pk == Variant.id)
                  .where(Commit.repo_pk == bindparam("pk"), Commit.sha == bindparam("sha"),
                         Variant.name == bindparam("name"))
                  .order_by(File.path))
_ALL_COMMIT_VARIANTS = (select(Commit.sha, Commit.parent_sha, Commit.scanned, Variant.name)
                        .outerjoin(Variant, Variant.commit_pk == Commit.id)
                        .where(Commit.repo_pk == bindparam("pk")).order_by(Commit.sha, Variant.name))

_COMMITS_NEWEST_FIRST = (select(Commit.sha, Commit.date, Commit.title, Commit.scanned, Variant.name,
                                 Variant.metadata_json.contains('"digest"'))
                         .outerjoin(Variant, Variant.commit_pk == Commit.id)
                         .where(Commit.repo_pk == bindparam("pk"))
                         .order_by(Commit.date.desc().nulls_last(), Commit.depth.desc(), Commit.sha, Variant.name))
_insert_refusal = sqlite_insert(RefusalRow.__table__)
_UPSERT_REFUSAL = _insert_refusal.on_conflict_do_update(
    index_elements=["repo_id", "requested", "target", "error", "detail"],
    set_={"count": RefusalRow.__table__.c.count + 1, "last_seen": _insert_refusal.excluded.last_seen,
          "message": _insert_refusal.excluded.message, "commit_sha": _insert_refusal.excluded.commit_sha},
)


class LedgerView:
    """Read-only answers for the resolver core, inside one session (one consistent snapshot).

    This is the hot path of every offline resolve, so it runs a few joined Core queries
    on the session's connection and remembers their rows for the life of the view,
    rather than loading ORM objects (which cost ~10× more per resolve).
    """

    def __init__(self, conn: Connection):
        self._conn = conn
        self._repos: dict[str, tuple[int | None, list[tuple[str, str, str]]]] = {}
        self._names: dict[tuple[str, str], tuple[str, ...] | None] = {}
        self._parents: dict[str, dict[str, str | None]] = {}

    def _repo_row(self, repo_id: str) -> tuple[int | None, list[tuple[str, str, str]]]:
        """(repo pk, [(kind, name, sha)] of live refs), in one query."""
        if repo_id not in self._repos:
            rows = self._conn.execute(_REPO_REFS, {"repo": repo_id}).all()
            pk = rows[0][0] if rows else None
            self._repos[repo_id] = (pk, [(k, n, c) for _, k, n, c in rows if k is not None])
        return self._repos[repo_id]

    def repo_pk(self, repo_id: str) -> int | None:
        return self._repo_row(repo_id)[0]

    def known(self, repo_id: str) -> bool:
        return self.repo_pk(repo_id) is not None

    def refs(self, repo_id: str) -> list[tuple[str, str, str]]:
        """Live refs as (kind, name, commit sha), branches then tags, by name."""
        return self._repo_row(repo_id)[1]

    def versions(self, repo_id: str) -> dict[int, str]:
        """Branches named v<N> (what `kernels` calls versions; tags are ignored, as it does)."""
        out = {int(name[1:]): sha for kind, name, sha in self.refs(repo_id)
               if kind == "branch" and name[:1] == "v" and name[1:].isdigit()}
        return dict(sorted(out.items()))

    def commit_for(self, repo_id: str, revision: str) -> str | None:
        """A branch, a tag, a full sha, or an unambiguous sha prefix (≥ 7 hex digits)."""
        for _kind, name, sha in self.refs(repo_id):
            if name == revision:
                return sha
        rev = revision.lower()
        if len(rev) >= 7 and all(c in "0123456789abcdef" for c in rev):
            shas = self._conn.execute(_SHA_PREFIX, {"pk": self.repo_pk(repo_id), "prefix": rev}).scalars().all()
            if len(shas) == 1:
                return shas[0]
        return None

    def variant_names(self, repo_id: str, sha: str) -> tuple[str, ...] | None:
        """The variant names at a commit, or None when its build/ listing was never recorded."""
        key = (repo_id, sha)
        if key not in self._names:
            rows = self._conn.execute(_VARIANT_NAMES, {"pk": self.repo_pk(repo_id), "sha": sha}).all()
            self._names[key] = tuple(n for _, n in rows if n is not None) if rows and rows[0][0] else None
        return self._names[key]

    def variant(self, repo_id: str, sha: str, name: str) -> tuple[tuple[FileEntry, ...], dict]:
        rows = self._conn.execute(_VARIANT_FILES, {"pk": self.repo_pk(repo_id), "sha": sha, "name": name}).all()
        files = tuple(FileEntry(p, n, oid, h) for _, p, n, oid, h in rows if p is not None)
        return files, json.loads(rows[0][0]) if rows and rows[0][0] else {}

    def history(self, repo_id: str, sha: str) -> list[str]:
        """First-parent history from `sha` back to the root, newest first, as far as recorded.

        Only refusals walk history; the first walk loads every commit's variant names too,
        since the refusal then asks which of those commits has the target.
        """
        if repo_id not in self._parents:
            rows = self._conn.execute(_ALL_COMMIT_VARIANTS, {"pk": self.repo_pk(repo_id)}).all()
            parents: dict[str, str | None] = {}
            names: dict[str, list[str]] = {}
            for c_sha, parent, scanned, vname in rows:
                parents[c_sha] = parent
                if scanned:
                    bucket = names.setdefault(c_sha, [])
                    if vname is not None:
                        bucket.append(vname)
            self._parents[repo_id] = parents
            for c_sha in parents:
                self._names.setdefault((repo_id, c_sha), tuple(names[c_sha]) if c_sha in names else None)
        parents = self._parents[repo_id]
        out, seen, cur = [], set(), sha
        while cur is not None and cur in parents and cur not in seen:
            out.append(cur)
            seen.add(cur)
            cur = parents[cur]
        return out

    def commits(self, repo_id: str) -> list[CommitRow]:
        """Every recorded commit, newest first, with its variant names (for the matrix)."""
        out: dict[str, CommitRow] = {}
        for sha, date, title, scanned, vname, digest in self._conn.execute(_COMMITS_NEWEST_FIRST,
                                                                           {"pk": self.repo_pk(repo_id)}):
            row = out.setdefault(sha, CommitRow(sha, date, title, bool(scanned), []))
            if vname is not None:
                row.variants.append(vname)
                if not digest:
                    row.no_digest.append(vname)
        return list(out.values())

    def commit_count(self, repo_id: str) -> int:
        return self._conn.execute(select(func.count()).select_from(Commit)
                                  .where(Commit.repo_pk == self.repo_pk(repo_id))).scalar_one()


def _variant_row(commit_pk: int, v: VariantInfo) -> Variant:
    fields = parse_fields(v.name)
    meta = v.metadata or {}
    return Variant(
        commit_pk=commit_pk, name=v.name,
        framework=fields and fields.framework, framework_version=fields and fields.framework_version,
        cxx11=fields and fields.cxx11, backend=fields and fields.backend, cpu=fields and fields.cpu,
        os=fields and fields.os, metadata_oid=v.metadata_oid,
        metadata_json=json.dumps(v.metadata, sort_keys=True) if v.metadata is not None else None,
        archs=json.dumps((meta.get("backend") or {}).get("archs")) if meta else None,
        kernel_depends=json.dumps(meta.get("kernel-depends", [])) if meta else None,
        files=[File(path=f.path, size=f.size, git_oid=f.git_oid, sha256=f.sha256) for f in v.files],
    )


def _repo(s: Session, repo_id: str, *, repo_type: str = "kernel", endpoint: str | None = None) -> Repo:
    repo = s.scalar(select(Repo).where(Repo.repo_id == repo_id))
    if repo is None:
        repo = Repo(repo_id=repo_id, repo_type=repo_type, endpoint=endpoint)
        s.add(repo)
        s.flush()
    elif endpoint is not None:
        s.execute(update(Repo).where(Repo.id == repo.id).values(endpoint=endpoint, repo_type=repo_type))
    return repo
