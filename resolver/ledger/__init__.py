"""The SQLite ledger: what upstream has (refs, history, variants, files) and every refusal.

WAL mode and a busy timeout let several processes (two stagers, a server) share one
home; every write is one short transaction. Reads go through `LedgerView`, bound to
one session, which is the availability provider the resolver core consumes. A ledger
this process cannot write (a read-only home) is opened read-only: see open.py.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from datetime import datetime
from pathlib import Path
from typing import Any, ParamSpec, TypeVar, cast

from sqlalchemy import URL, Connection, Engine, delete, select
from sqlalchemy.exc import DatabaseError, IntegrityError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from ..errors import FrtError, HomeReadOnly, LedgerCorrupt, LedgerDropped, LedgerUnavailable, LocalDiskError, first_line
from ..ledger_file import DISK_FULL_CODES, cannot_write
from ..refusal_records import REFUSAL_COLUMNS, RefusalRecord
from ..resolution import CommitInfo, Refusal, VariantInfo
from .migrations import SchemaTrack, check_read_only, migrate, utcnow
from .open import (
    WRITING,
    AdvisoryLock,
    busy_timeout,
    ledger_url,
    lock_server_writes,
    read_only_engine,
    read_write_engine,
    server_engine,
)
from .retry import dropped, retried, retry_budget, run_retrying
from .rows import PublisherInfo, find_repo, upsert_refusal, variant_row
from .schema import RESOLVER_TRACK, Commit, Listing, Publisher, Ref, RefusalRow, Repo, Variant
from .view import LedgerView

T = TypeVar("T")
P = ParamSpec("P")


def _locked(orig: BaseException) -> bool:
    """SQLite's busy timeout, or PostgreSQL's lock_timeout on the writer lock, ran out."""
    if isinstance(orig, sqlite3.OperationalError):
        return "locked" in str(orig)
    return getattr(orig, "sqlstate", None) == "55P03"  # lock_not_available


class Ledger:
    """`readonly`: open it read-only (no migration, no journal-mode change, no write); None: read-only
    exactly when this process cannot write it (a read-only home). `tracks`: the other layers' schema
    tracks kept in this ledger (the mirror's `Home` names its own), migrated, or checked when
    read-only, with the resolver's. `retry_s`: how long `retrying` rides out a server's dropped
    connections (None: retry.retry_budget, 0 outside a writer command)."""

    def __init__(
        self,
        where: Path | str | URL,
        readonly: bool | None = None,
        tracks: tuple[SchemaTrack, ...] = (),
        retry_s: float | None = None,
    ):
        url = ledger_url(where) if isinstance(where, str) and "://" in where else where
        if isinstance(url, URL) and url.drivername == "sqlite":
            url = Path(cast(str, url.database))  # a sqlite URL names its file (ledger_url checks one as text)
        # A server ledger (PostgreSQL) has a URL and no path; a file ledger (SQLite) a path.
        loc = url if isinstance(url, URL) else Path(url)
        self.url: URL | None = loc if isinstance(loc, URL) else None
        self.path: Path | None = None if isinstance(loc, URL) else loc
        self.where = self.url.render_as_string(hide_password=True) if self.url else str(self.path)
        if readonly is None:
            readonly = False if isinstance(loc, URL) else cannot_write(loc)
        self.readonly = readonly
        self.tracks = (RESOLVER_TRACK, *tracks)
        engine: Engine | None = None  # self.engine once made
        self.retry_s = retry_budget() if retry_s is None else retry_s
        self._retrying: ContextVar[bool] = ContextVar(f"ledger-retrying-{id(self)}", default=False)
        self._locks: set[AdvisoryLock] = set()  # named locks held now, retaken after a restart
        self._locks_mutex = threading.Lock()
        # The write transaction that this thread's sessions and writes join (`transaction`), if any.
        self._outer: ContextVar[Session | None] = ContextVar(f"ledger-outer-{id(self)}", default=None)
        try:
            self.engine = engine = (
                server_engine(loc, readonly=readonly)
                if isinstance(loc, URL)
                else read_only_engine(loc)
                if readonly
                else read_write_engine(loc)
            )
            self._sessions = sessionmaker(self.engine, expire_on_commit=False)
            self.retrying(self._check_or_migrate)
        except (FrtError, DatabaseError, sqlite3.DatabaseError) as e:
            if engine is not None:
                engine.dispose()
            if isinstance(e, FrtError):
                raise
            raise LedgerCorrupt(f"ledger {self.where} cannot be opened: {first_line(e)}") from None

    def _check_or_migrate(self) -> None:
        if self.readonly:
            with self._unreadable_as_corrupt("cannot be opened"), self.engine.connect() as conn:
                for track in self.tracks:
                    check_read_only(conn, track, where=f"ledger {self.where}")
        else:
            with self.write(failure="cannot be opened") as conn:
                for track in self.tracks:
                    migrate(conn, track)

    def close(self) -> None:
        self.engine.dispose()

    def retrying(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn(*args, **kwargs)`, one whole unit of ledger work that begins and ends its transactions,
        run again from its start where a server ledger dropped the connection, for `retry_s` seconds
        (retry.py). Inside a `transaction` or another retried unit it runs once: the outermost
        unit is the one re-run, never the rest of a transaction begun before."""
        if not (self.url and self.retry_s > 0) or self._outer.get() is not None or self._retrying.get():
            return fn(*args, **kwargs)
        token = self._retrying.set(True)
        try:
            return run_retrying(
                lambda: fn(*args, **kwargs), budget=self.retry_s, where=self.where, before_retry=self._retake_locks
            )
        finally:
            self._retrying.reset(token)

    def _check_writable(self) -> None:
        if self.readonly:
            raise HomeReadOnly(
                f"ledger {self.where} is open read-only (its home is read-only here) and this "
                "writes to it: run it where the home is writable"
            )

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """One write transaction that every `session` and `write` on this thread joins until it ends:
        several writers' rows commit together or not at all (an import's repos, builds, staged rows)."""
        if (outer := self._outer.get()) is not None:
            yield outer
            return
        with self.session() as s:
            token = self._outer.set(s)
            try:
                yield s
            finally:
                self._outer.reset(token)

    @contextmanager
    def write(self, failure: str = "is unreadable") -> Iterator[Connection]:
        """One write transaction, begun IMMEDIATE: it takes the write lock up front (waiting up to
        the busy timeout), so two processes never both read, then collide on upgrading to write."""
        if (outer := self._outer.get()) is not None:
            outer.flush()  # a Core statement here sees the outer's ORM rows
            yield outer.connection()
            return
        self._check_writable()
        token = WRITING.set(True)
        try:
            with self._unreadable_as_corrupt(failure), self.engine.begin() as conn:
                if self.url:
                    lock_server_writes(conn)
                yield conn
        finally:
            WRITING.reset(token)

    @contextmanager
    def session(self, write: bool = True) -> Iterator[Session]:
        """An ORM session in one transaction: IMMEDIATE (as `write`) unless `write=False`, for reads
        that must not queue behind, or hold up, a stager's writes. Inside `transaction`: its session."""
        if (outer := self._outer.get()) is not None:
            outer.flush()  # what the outer wrote so far is what this one reads
            yield outer
            return
        if write:
            self._check_writable()
        token = WRITING.set(write)
        try:
            with self._unreadable_as_corrupt(), self._sessions() as s, s.begin():
                if write and self.url:
                    lock_server_writes(s.connection())
                yield s
        finally:
            WRITING.reset(token)

    @contextmanager
    def view(self) -> Iterator[LedgerView]:
        """A read snapshot on a plain connection: no ORM session on the resolve hot path."""
        with self._unreadable_as_corrupt(), self.engine.connect() as conn:
            if self.url:  # one snapshot for the whole view, as SQLite's read transaction is
                conn = conn.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin():
                yield LedgerView(conn)

    @contextmanager
    def _unreadable_as_corrupt(self, failure: str = "is unreadable") -> Iterator[None]:
        try:
            yield
        except (DatabaseError, sqlite3.DatabaseError) as e:
            orig = getattr(e, "orig", e)
            code = getattr(orig, "sqlite_errorname", "")
            if code in DISK_FULL_CODES:  # SHMSIZE: no room for its index beside it (ledger_file.SHM_BYTES)
                said = "no space left for its index (-shm)" if code == "SQLITE_IOERR_SHMSIZE" else orig
                raise LocalDiskError(f"cannot write ledger {self.where}: {said} (a local disk error)") from None
            if _locked(orig):
                raise LedgerUnavailable(
                    f"ledger {self.where} is locked by another process past the "
                    f"{busy_timeout():g} s busy timeout: try again later"
                ) from None
            if self.url and dropped(e):  # a writer retries it (`retrying`)
                raise LedgerDropped(f"ledger {self.where} is unavailable: {first_line(orig)}") from None
            if self.url and isinstance(e, OperationalError):
                # The server is down, restarting or unreachable: the same "try again later" as the Hub.
                raise LedgerUnavailable(f"ledger {self.where} is unavailable: {first_line(orig)}") from None
            if isinstance(orig, (sqlite3.IntegrityError, sqlite3.OperationalError)) or isinstance(e, IntegrityError):
                raise  # a constraint is a bug, not a corrupt file
            raise LedgerCorrupt(f"ledger {self.where} {failure}: {first_line(e)}") from None

    def named_lock(
        self, name: str, *, shared: bool = False, on_wait: Callable[[], None] | None = None
    ) -> AbstractContextManager[None]:
        """A lock held across processes and hosts while the block runs: on a server ledger, the
        server's advisory lock (open.AdvisoryLock); on SQLite, none (the caller's file lock,
        on one host, is the lock)."""
        return self._server_lock(name, shared, on_wait) if self.url else nullcontext()

    @contextmanager
    def _server_lock(self, name: str, shared: bool, on_wait: Callable[[], None] | None) -> Iterator[None]:
        lock = AdvisoryLock(self.engine, name, shared=shared)
        self.retrying(lock.take, on_wait)
        with self._locks_mutex:
            self._locks.add(lock)
        try:
            yield
        finally:
            with self._locks_mutex:
                self._locks.discard(lock)
            lock.release()

    def _retake_locks(self) -> None:
        """Before a retry: a restart that cut the unit's connection cut the named locks' too (a stage's
        hold on the store, which keeps gc from removing what it stored and has not yet recorded)."""
        with self._locks_mutex:
            held = list(self._locks)
        for lock in held:
            lock.retake()

    # -- writes -------------------------------------------------------------------------

    @retried
    def record_refs(
        self, repo_id: str, refs: dict[tuple[str, str], str], *, endpoint: str | None, repo_type: str = "kernel"
    ) -> None:
        """Record upstream's refs {(kind, name): sha}; refs it no longer has are marked gone."""
        now = utcnow()
        with self.session() as s:
            repo = find_repo(s, repo_id, repo_type=repo_type, endpoint=endpoint)
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

    @retried
    def record_history(self, repo_id: str, head: str, history: list[CommitInfo]) -> None:
        """Record what the upstream listed as `head`'s history (list_repo_commits), newest first: its
        commits, and the listing itself, which replaces an earlier one of the same head."""
        with self.session() as s:
            repo = find_repo(s, repo_id)
            known = {c.sha: c for c in s.scalars(select(Commit).where(Commit.repo_pk == repo.id))}
            for depth, c in enumerate(reversed(history)):
                row = known.get(c.sha)
                if row is None:
                    known[c.sha] = Commit(repo_pk=repo.id, sha=c.sha, depth=depth, date=c.date, title=c.title)
                    s.add(known[c.sha])
                elif row.depth < 0:  # recorded by record_build before its history was known
                    row.depth, row.date, row.title = depth, c.date, c.title
            s.execute(delete(Listing).where(Listing.repo_pk == repo.id, Listing.head == head))
            s.add_all(Listing(repo_pk=repo.id, head=head, position=i, sha=c.sha) for i, c in enumerate(history))

    @retried
    def record_builds(self, repo_id: str, builds: dict[str, list[VariantInfo]]) -> None:
        """Record the build/ listings of commits {sha: variants}, in one transaction."""
        with self.session() as s:
            repo = find_repo(s, repo_id)
            rows = {
                c.sha: c
                for c in s.scalars(select(Commit).where(Commit.repo_pk == repo.id, Commit.sha.in_(list(builds))))
            }
            for sha, variants in builds.items():
                commit = rows.get(sha)
                if commit is None:
                    commit = Commit(repo_pk=repo.id, sha=sha, depth=-1, date=None, title="")
                    s.add(commit)
                    s.flush()
                s.execute(delete(Variant).where(Variant.commit_pk == commit.id))
                s.add_all(variant_row(commit.id, v) for v in variants)
                commit.scanned = True

    @retried
    def record_refusal(self, refusal: Refusal) -> None:
        """One upsert on the refusal's full key: a repeat counts, a different failure is a new row."""
        if self.readonly:  # a read-only home keeps no record; the caller still gets the refusal itself
            return
        r, now = refusal, utcnow()
        with self.write() as conn:
            conn.execute(
                upsert_refusal(conn),
                {
                    "repo_id": r.repo,
                    "requested": r.request.label,
                    "target": str(r.target),
                    "error": r.error,
                    "detail": r.detail,
                    "version": r.request.version,
                    "revision": r.request.revision,
                    "commit_sha": r.commit,
                    "message": r.message,
                    "count": 1,
                    "first_seen": now,
                    "last_seen": now,
                },
            )

    @retried
    def record_publisher(
        self, org: str, trusted: bool, *, endpoint: str | None, seen_at: datetime | None = None
    ) -> None:
        """The upstream's trustedKernelPublisher for `org` (a later answer replaces an earlier one;
        an import keeps the newer of its own and the bundle's)."""
        seen = seen_at or utcnow()
        with self.session() as s:
            row = s.get(Publisher, org)
            if row is None:
                s.add(Publisher(org=org, trusted=trusted, endpoint=endpoint, seen_at=seen))
            elif row.seen_at <= seen:
                row.trusted, row.endpoint, row.seen_at = trusted, endpoint, seen

    @retried
    def publishers(self, orgs: set[str] | None = None) -> dict[str, PublisherInfo]:
        with self.session(write=False) as s:
            q = select(Publisher)
            if orgs is not None:
                q = q.where(Publisher.org.in_(orgs))
            return {p.org: PublisherInfo(p.org, p.trusted, p.endpoint, p.seen_at) for p in s.scalars(q)}

    @retried
    def known_metadata(self, oids: set[str]) -> dict[str, dict[str, Any]]:
        """metadata.json contents already recorded, by git oid: identical files are not refetched."""
        if not oids:
            return {}
        with self.session(write=False) as s:
            rows = cast(  # the WHERE leaves no NULL in either column
                Iterable[tuple[str, str]],
                s.execute(
                    select(Variant.metadata_oid, Variant.metadata_json)
                    .where(Variant.metadata_oid.in_(oids), Variant.metadata_json.is_not(None))
                    .distinct()
                ),
            )
            return {oid: json.loads(doc) for oid, doc in rows}

    @retried
    def unscanned_commits(self, repo_id: str) -> list[str]:
        with self.session(write=False) as s:
            return list(
                s.scalars(
                    select(Commit.sha)
                    .join(Repo)
                    .where(Repo.repo_id == repo_id, ~Commit.scanned)
                    .order_by(Commit.depth.desc())
                )
            )

    @retried
    def refusals(self) -> list[RefusalRecord]:
        with self.session(write=False) as s:
            rows = s.scalars(select(RefusalRow).order_by(RefusalRow.last_seen.desc(), RefusalRow.id.desc()))
            return [RefusalRecord(*(getattr(r, c) for c in REFUSAL_COLUMNS)) for r in rows]

    @retried
    def repos(self) -> list[str]:
        with self.session(write=False) as s:
            return list(s.scalars(select(Repo.repo_id).order_by(Repo.repo_id)))
