"""The SQLite ledger: what upstream has (refs, history, variants, files) and every refusal.

WAL mode and a busy timeout let several processes (two stagers, a server) share one
home; every write is one short transaction. Reads go through `LedgerView`, bound to
one session, which is the availability provider the resolver core consumes.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine, delete, event, select, update
from sqlalchemy.exc import DatabaseError, OperationalError
from sqlalchemy.orm import Session, selectinload, sessionmaker

from .errors import LedgerCorrupt
from .resolution import CommitInfo, FileEntry, Refusal, VariantInfo
from .schema import Commit, File, Ref, RefusalRow, Repo, Variant, migrate, utcnow
from .variants import parse_fields

BUSY_TIMEOUT_MS = 30_000


class Ledger:
    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.engine = create_engine(f"sqlite:///{self.path}", connect_args={"timeout": BUSY_TIMEOUT_MS / 1000})
        event.listen(self.engine, "connect", _configure_connection)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        try:
            with self.engine.begin() as conn:
                migrate(conn)
        except (DatabaseError, OperationalError, sqlite3.DatabaseError) as e:
            self.engine.dispose()
            raise LedgerCorrupt(f"ledger {self.path} cannot be opened: {_short(e)}") from None

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self._sessions() as s:
            try:
                with s.begin():
                    yield s
            except (DatabaseError, sqlite3.DatabaseError) as e:
                if isinstance(e, OperationalError) and "locked" in str(e):
                    raise
                raise LedgerCorrupt(f"ledger {self.path} is unreadable: {_short(e)}") from None

    @contextmanager
    def view(self) -> Iterator[LedgerView]:
        with self.session() as s:
            yield LedgerView(s)

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

    def record_build(self, repo_id: str, sha: str, variants: list[VariantInfo]) -> None:
        """Record the build/ listing of one commit (replacing any earlier record of it)."""
        with self.session() as s:
            repo = _repo(s, repo_id)
            commit = s.scalar(select(Commit).where(Commit.repo_pk == repo.id, Commit.sha == sha))
            if commit is None:
                commit = Commit(repo_pk=repo.id, sha=sha, parent_sha=None, depth=-1, date=None, title="")
                s.add(commit)
                s.flush()
            s.execute(delete(Variant).where(Variant.commit_pk == commit.id))
            for v in variants:
                fields = parse_fields(v.name)
                meta = v.metadata or {}
                s.add(Variant(
                    commit_pk=commit.id, name=v.name,
                    framework=fields and fields.framework, framework_version=fields and fields.framework_version,
                    cxx11=fields and fields.cxx11, backend=fields and fields.backend,
                    cpu=fields and fields.cpu, os=fields and fields.os,
                    metadata_oid=v.metadata_oid,
                    metadata_json=json.dumps(v.metadata, sort_keys=True) if v.metadata is not None else None,
                    archs=json.dumps((meta.get("backend") or {}).get("archs")) if meta else None,
                    kernel_depends=json.dumps(meta.get("kernel-depends", [])) if meta else None,
                    files=[File(path=f.path, size=f.size, git_oid=f.git_oid, sha256=f.sha256) for f in v.files],
                ))
            commit.scanned = True

    def record_refusal(self, refusal: Refusal) -> None:
        r, now = refusal, utcnow()
        key = dict(repo_id=r.repo, requested=r.request.label, target=str(r.target), error=r.error, detail=r.detail)
        with self.session() as s:
            row = s.scalar(select(RefusalRow).filter_by(**key))
            if row is None:
                s.add(RefusalRow(**key, version=r.request.version, revision=r.request.revision,
                                 commit_sha=r.commit, message=r.message, first_seen=now, last_seen=now))
            else:
                row.count += 1
                row.last_seen, row.message, row.commit_sha = now, r.message, r.commit

    def known_metadata(self, oids: set[str]) -> dict[str, dict]:
        """metadata.json contents already recorded, by git oid: identical files are not refetched."""
        if not oids:
            return {}
        with self.session() as s:
            rows = s.execute(select(Variant.metadata_oid, Variant.metadata_json)
                             .where(Variant.metadata_oid.in_(oids), Variant.metadata_json.is_not(None))
                             .distinct())
            return {oid: json.loads(doc) for oid, doc in rows}

    def unscanned_commits(self, repo_id: str) -> list[str]:
        with self.session() as s:
            return list(s.scalars(select(Commit.sha).join(Repo).where(Repo.repo_id == repo_id, ~Commit.scanned)
                                  .order_by(Commit.depth.desc())))

    def refusals(self) -> list[RefusalRow]:
        with self.session() as s:
            return list(s.scalars(select(RefusalRow).order_by(RefusalRow.last_seen.desc(), RefusalRow.id.desc())))

    def repos(self) -> list[str]:
        with self.session() as s:
            return list(s.scalars(select(Repo.repo_id).order_by(Repo.repo_id)))


class LedgerView:
    """Read-only answers for the resolver core, inside one session (one consistent snapshot)."""

    def __init__(self, session: Session):
        self.s = session
        self._repo_pk: dict[str, int | None] = {}

    def repo_pk(self, repo_id: str) -> int | None:
        if repo_id not in self._repo_pk:
            self._repo_pk[repo_id] = self.s.scalar(select(Repo.id).where(Repo.repo_id == repo_id))
        return self._repo_pk[repo_id]

    def known(self, repo_id: str) -> bool:
        return self.repo_pk(repo_id) is not None

    def refs(self, repo_id: str) -> list[Ref]:
        return list(self.s.scalars(select(Ref).where(Ref.repo_pk == self.repo_pk(repo_id), ~Ref.gone)
                                   .order_by(Ref.kind, Ref.name)))

    def versions(self, repo_id: str) -> dict[int, str]:
        """Branches named v<N> (what `kernels` calls versions; tags are ignored, as it does)."""
        out = {}
        for ref in self.refs(repo_id):
            if ref.kind == "branch" and ref.name[:1] == "v" and ref.name[1:].isdigit():
                out[int(ref.name[1:])] = ref.commit_sha
        return dict(sorted(out.items()))

    def commit_for(self, repo_id: str, revision: str) -> str | None:
        """A branch, a tag, a full sha, or an unambiguous sha prefix (≥ 7 hex digits)."""
        pk = self.repo_pk(repo_id)
        for ref in self.refs(repo_id):
            if ref.name == revision:
                return ref.commit_sha
        rev = revision.lower()
        if len(rev) >= 7 and all(c in "0123456789abcdef" for c in rev):
            shas = list(self.s.scalars(select(Commit.sha).where(Commit.repo_pk == pk, Commit.sha.startswith(rev))
                                       .limit(2)))
            if len(shas) == 1:
                return shas[0]
        return None

    def _commit(self, repo_id: str, sha: str) -> Commit | None:
        return self.s.scalar(select(Commit).where(Commit.repo_pk == self.repo_pk(repo_id), Commit.sha == sha))

    def variant_names(self, repo_id: str, sha: str) -> tuple[str, ...] | None:
        """The variant names at a commit, or None when its build/ listing was never recorded."""
        c = self._commit(repo_id, sha)
        if c is None or not c.scanned:
            return None
        return tuple(self.s.scalars(select(Variant.name).where(Variant.commit_pk == c.id).order_by(Variant.name)))

    def variant(self, repo_id: str, sha: str, name: str) -> tuple[tuple[FileEntry, ...], dict]:
        v = self.s.scalar(select(Variant).join(Commit)
                          .where(Commit.repo_pk == self.repo_pk(repo_id), Commit.sha == sha, Variant.name == name)
                          .options(selectinload(Variant.files)))
        files = tuple(FileEntry(f.path, f.size, f.git_oid, f.sha256) for f in v.files)
        return files, json.loads(v.metadata_json) if v.metadata_json else {}

    def history(self, repo_id: str, sha: str) -> list[str]:
        """First-parent history from `sha` back to the root, newest first, as far as recorded."""
        pk = self.repo_pk(repo_id)
        parents = dict(self.s.execute(select(Commit.sha, Commit.parent_sha).where(Commit.repo_pk == pk)).all())
        out, cur = [], sha
        while cur is not None and cur in parents and cur not in out:
            out.append(cur)
            cur = parents[cur]
        return out

    def commits(self, repo_id: str) -> list[Commit]:
        """Every recorded commit, newest first, with its variants loaded."""
        return list(self.s.scalars(select(Commit).where(Commit.repo_pk == self.repo_pk(repo_id))
                                   .options(selectinload(Commit.variants))
                                   .order_by(Commit.date.desc().nulls_last(), Commit.depth.desc())))


def _repo(s: Session, repo_id: str, *, repo_type: str = "kernel", endpoint: str | None = None) -> Repo:
    repo = s.scalar(select(Repo).where(Repo.repo_id == repo_id))
    if repo is None:
        repo = Repo(repo_id=repo_id, repo_type=repo_type, endpoint=endpoint)
        s.add(repo)
        s.flush()
    elif endpoint is not None:
        s.execute(update(Repo).where(Repo.id == repo.id).values(endpoint=endpoint, repo_type=repo_type))
    return repo


def _configure_connection(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    cur.execute("PRAGMA journal_mode = WAL")
    cur.execute("PRAGMA synchronous = NORMAL")
    cur.execute("PRAGMA foreign_keys = ON")
    cur.close()


def _short(e: BaseException) -> str:
    orig = getattr(e, "orig", None) or e
    return str(orig).splitlines()[0]
