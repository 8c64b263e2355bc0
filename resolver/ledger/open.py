"""How the ledger's SQLite file is opened: read-write (WAL, migrated on open), or read-only, for a home
on a read-only mount (a cluster's shared filesystem) and for readers that must never write (seats).

What SQLite needs to read a WAL-mode database it cannot write (checked on a read-only bind mount,
SQLite 3.40):

- ``mode=ro`` reads the write-ahead log through its ``-shm`` index, so it opens only where the ``-shm``
  exists (a writer has the ledger open, or died and left it) or can be created. On a read-only mount a
  cleanly closed ledger has neither ``-wal`` nor ``-shm``, and ``mode=ro`` fails: SQLITE_CANTOPEN.
- ``immutable=1`` reads the main file alone, with no locks and no ``-shm``: it opens on any mount, but
  it ignores a ``-wal``, so it is right only where there is no log to read (a clean close folds the
  log into the main file and deletes it). It also assumes nobody writes meanwhile: a home read this
  way is read as it was when opened.
- A ``-wal`` with frames and no ``-shm`` on a read-only mount can be read neither way without losing
  what the log holds; it must be opened once read-write (which checkpoints it).

So a read-only ledger tries ``mode=ro``, falls back to ``immutable=1`` when there is no log to lose,
and otherwise says what to do in one line. It never migrates and never sets the journal mode (both
are writes); a schema this code does not read as it is is refused.
"""

from __future__ import annotations

import functools
import hashlib
import sqlite3
import threading
from collections.abc import Callable
from contextvars import ContextVar
from pathlib import Path

from sqlalchemy import URL, Connection, Engine, create_engine, event, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlalchemy.pool import ConnectionPoolEntry

from ..errors import BadInput, LedgerDropped, LedgerUnavailable, first_line
from ..ledger_file import read_only_params, uri
from ..settings import env_number
from .retry import dropped


def busy_timeout() -> float:
    """How long a ledger write waits for another process's write lock, in seconds
    (FRT_LEDGER_BUSY_TIMEOUT, default 30): past it, the command stops with "try again later"."""
    # At most 10^6 s: SQLite's busy timeout and PostgreSQL's lock_timeout take milliseconds as a C int.
    return env_number("FRT_LEDGER_BUSY_TIMEOUT", 30.0, high=10**6)


# Whether the transaction being begun on this thread will write (see Ledger.write).
WRITING: ContextVar[bool] = ContextVar("frt_ledger_writing", default=False)


def read_write_engine(path: Path) -> Engine:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a file where the home should be, a parent without write permission
        raise BadInput(f"home {path.parent} cannot be created or used: {e.strerror}") from None
    timeout = busy_timeout()
    engine = create_engine(f"sqlite:///{path}", connect_args={"timeout": timeout})
    event.listen(engine, "connect", functools.partial(_configure_read_write, timeout))
    event.listen(engine, "begin", _begin)
    return engine


def read_only_engine(path: Path) -> Engine:
    if not path.is_file():
        raise BadInput(f"no ledger at {path}: nothing was staged or scanned in this home")
    path_uri = uri(path)
    url = URL.create("sqlite", database=f"file:{path_uri}", query={**read_only_params(path, path_uri), "uri": "true"})
    timeout = busy_timeout()
    engine = create_engine(url, connect_args={"timeout": timeout})
    event.listen(engine, "connect", functools.partial(_configure_read_only, timeout))
    event.listen(engine, "begin", lambda conn: conn.exec_driver_sql("BEGIN"))
    return engine


def ledger_url(text: str) -> URL:
    """A ledger URL the user gave (--ledger, FRT_LEDGER_URL): SQLite, or PostgreSQL through psycopg 3.
    `postgresql://` and `postgres://` mean psycopg 3 here, the driver the `postgres` extra installs."""
    try:
        url = make_url(text)
        port = url.port  # make_url takes `[::1` or `:notaport` and raises ValueError only here
    except (ArgumentError, ValueError):
        raise BadInput(
            f"ledger URL {text!r} is not a URL: expected postgresql://USER@HOST:PORT/DB or sqlite:///PATH"
        ) from None
    if port is not None and not 0 < port < 65536:
        raise BadInput(f"ledger URL {url.render_as_string(hide_password=True)!r}: port {port} is not 1-65535")
    if url.drivername in ("postgresql", "postgres", "postgresql+psycopg"):
        return url.set(drivername="postgresql+psycopg")
    if url.drivername == "sqlite" and url.database and "\0" not in url.database:
        return url
    raise BadInput(
        f"ledger URL {url.render_as_string(hide_password=True)!r}: frt-mirror keeps its ledger in "
        "SQLite (sqlite:///PATH) or PostgreSQL (postgresql://USER@HOST:PORT/DB)"
    )


def server_engine(url: URL, *, readonly: bool) -> Engine:
    """A ledger on a database server (PostgreSQL). Writers serialise on a transaction-scoped advisory
    lock taken at the start of every write (Ledger.write), as SQLite's BEGIN IMMEDIATE does: the
    ledger's writes read, then write, and must not interleave. No ping before each checkout (a round
    trip on every resolve, about a fifth of an offline resolve's time here): a connection a server
    restart dropped fails its command, which is one line and exit 3, and SQLAlchemy then empties the
    pool, so a long-running process (serve's poller) reconnects on its next try, and a writer retries the
    unit (retry.py), which needs no ping: the failed statement is its ping."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        raise BadInput("a PostgreSQL ledger needs psycopg 3: pip install 'frt-mirror[postgres]'") from None
    timeout = max(1, int(env_number("FRT_LEDGER_CONNECT_TIMEOUT", 10.0)))
    engine = create_engine(
        url, pool_size=12, max_overflow=24, connect_args={"connect_timeout": timeout, "application_name": "frt-mirror"}
    )
    return engine.execution_options(postgresql_readonly=True) if readonly else engine


def lock_server_writes(conn: Connection) -> None:
    """The start of a write on a server ledger: wait (up to the busy timeout) for the one writer lock."""
    conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{int(busy_timeout() * 1000)}ms'")
    conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({WRITE_LOCK})")


class AdvisoryLock:
    """A lock named `name`, held on its own connection to the server from `take` to `release`; every
    host using this database honours it, and the server drops it if this process dies (or the server
    restarts: `retake`). `shared`: any number of shared holders, no exclusive one."""

    def __init__(self, engine: Engine, name: str, *, shared: bool = False):
        self.engine, self.name = engine, name
        self._key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)
        self._kind = "_shared" if shared else ""
        self._conn: Connection | None = None
        self._held = False
        self._mutex = threading.Lock()  # a retry on another thread may retake it while its holder releases

    def take(self, on_wait: Callable[[], None] | None = None) -> None:
        """`on_wait` is called once, before waiting, when another holder has it."""
        try:
            conn = self.engine.connect()
            try:
                if not conn.exec_driver_sql(f"SELECT pg_try_advisory_lock{self._kind}({self._key})").scalar():
                    if on_wait is not None:
                        on_wait()
                    conn.exec_driver_sql(f"SELECT pg_advisory_lock{self._kind}({self._key})")
                conn.commit()  # hold no transaction (nor its snapshot) for as long as the block takes
            except BaseException:
                _close_quietly(conn)
                raise
        except DBAPIError as e:
            where = self.engine.url.render_as_string(hide_password=True)
            text = f"ledger {where} is unavailable (taking the lock on {self.name}): {first_line(e.orig)}"
            raise (LedgerDropped if dropped(e) else LedgerUnavailable)(text) from None
        self._conn, self._held = conn, True

    def retake(self) -> None:
        """Take it again if the server dropped its connection, and the lock with it (a restart). Another
        process may have held it in between: the gap is the restart's, and this closes it."""
        with self._mutex:
            if not self._held:
                return
            if self._conn is not None:
                try:
                    self._conn.exec_driver_sql("SELECT 1")
                    self._conn.commit()
                    return
                except DBAPIError:
                    _close_quietly(self._conn)
                    self._conn = None
            self.take()

    def release(self) -> None:
        with self._mutex:
            conn, self._conn, self._held = self._conn, None, False
            if conn is None:
                return
            try:
                conn.exec_driver_sql(f"SELECT pg_advisory_unlock{self._kind}({self._key})")
                conn.commit()
            except DBAPIError:
                pass  # the server dropped the connection, and the lock with it
            finally:
                _close_quietly(conn)


def _close_quietly(conn: Connection) -> None:
    try:
        conn.close()
    except DBAPIError:
        pass  # a dead connection: nothing left to give back


# The advisory lock key every writer of a server ledger takes (any 64-bit number no other
# application on that database uses: these are the bytes of "frt-ledg").
WRITE_LOCK = int.from_bytes(b"frt-ledg", "big", signed=True)


def _begin(conn: Connection) -> None:
    conn.exec_driver_sql("BEGIN IMMEDIATE" if WRITING.get() else "BEGIN")


def _configure_read_write(timeout: float, dbapi_conn: sqlite3.Connection, _record: ConnectionPoolEntry) -> None:
    # The driver must not open transactions on its own: `_begin` does, IMMEDIATE for writers.
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
    cur.execute("PRAGMA journal_mode = WAL")
    cur.execute("PRAGMA synchronous = NORMAL")
    cur.execute("PRAGMA foreign_keys = ON")
    cur.close()


def _configure_read_only(timeout: float, dbapi_conn: sqlite3.Connection, _record: ConnectionPoolEntry) -> None:
    # No journal_mode here: changing it is a write (and an immutable open reports "delete" anyway).
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
    cur.close()
