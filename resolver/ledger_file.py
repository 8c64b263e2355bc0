"""A SQLite ledger file opened with the standard library alone: whether this process may write it, how a
read-only opener reaches it (the rules open.py's docstring gives: ``mode=ro``, else ``immutable=1`` where
there is no log to lose), and a quick read for the commands a cluster's job start runs, which must not pay
for importing SQLAlchemy (it costs about five times Python's own start-up with click).

A quick read answers only where the file's schema is exactly this code's, for every track it names; it
returns None otherwise (no file, an empty one, a schema to migrate or newer than this code, any error),
and the caller takes the ledger's own path, which migrates, refuses or explains in its one line."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar
from urllib.parse import quote

from .errors import HomeReadOnly, LocalDiskError

T = TypeVar("T")

# The resolver's schema version (schema.py migrates a ledger to it) and its tables at that version: here,
# where a quick read checks them (tests/test_start_up.py holds the tables to schema.py's).
SCHEMA_VERSION = 5
TABLES = frozenset(
    {"commits", "files", "listings", "publishers", "refs", "refusals", "repos", "schema_migrations", "variants"}
)


def uri(path: Path) -> str:
    # An SQLite URI filename: '?', '#' and '%' in the path would otherwise end it or be decoded.
    return quote(str(path.absolute()))


def cannot_write(path: Path) -> bool:
    """Whether this process cannot write the ledger at `path`: the file or its directory (where SQLite
    puts -wal and -shm) is not writable. access() says EROFS on a read-only mount even to root, whose
    permission bits prove nothing."""
    if path.exists():
        return not (os.access(path, os.W_OK) and os.access(path.parent, os.W_OK))
    return path.parent.is_dir() and not os.access(path.parent, os.W_OK)


# The wal-index SQLite keeps beside a WAL ledger (-shm): its first connection sizes it to 32 KiB and writes a
# byte into each of its pages, so that a full disk fails the open (SQLITE_IOERR_SHMSIZE, leaving a 3-byte
# stub behind) rather than a later access to the mapping (SIGBUS).
SHM_BYTES = 32 * 1024
# Below this much free space the ledger's disk counts as full: too little for the index and a transaction's
# pages in the log. Commands that only read then open the ledger read-only (mirror/store/home.py), never
# failing on the index they do not need; a write on a disk with more free space than this that fills anyway
# fails on its own (SQLITE_FULL, a local disk error).
ROOM_BYTES = 1 << 20
# What SQLite says when the disk it writes its index or log to is full (open.py maps them to exit 4).
DISK_FULL_CODES = frozenset({"SQLITE_FULL", "SQLITE_IOERR_SHMSIZE"})


def free_bytes(folder: Path) -> int:
    """Bytes this process may still write on the filesystem of `folder`: root may use the blocks the
    filesystem keeps back for it (ext4's 5%), anyone else may not."""
    st = os.statvfs(folder)
    return (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize


def disk_full(path: Path) -> bool:
    """Whether the disk of the ledger at `path` has less than ROOM_BYTES free (False where that cannot be
    asked: no folder there yet, a platform without statvfs)."""
    try:
        return free_bytes(path.parent) < ROOM_BYTES
    except (OSError, AttributeError):
        return False


def read_only_params(path: Path, path_uri: str) -> dict[str, str]:
    """How this process opens the ledger at `path` read-only: ``mode=ro`` where it can, else
    ``immutable=1`` where no write-ahead log would be lost; HomeReadOnly otherwise (ledger/open.py says why).

    On a full disk ``mode=ro`` works only where a live writer's index (-shm) is there at its size: it
    would create or grow one, fail (SQLITE_IOERR_SHMSIZE) and leave a stub. So it is not tried without
    one, and ``immutable=1`` reads the main file where there is no log: nobody has the ledger open then (a
    live connection keeps its -shm), and none can open it read-write until space is freed."""
    shm = path.with_name(f"{path.name}-shm")
    live_index = shm.is_file() and shm.stat().st_size >= SHM_BYTES
    if live_index or not disk_full(path):
        try:
            probe = sqlite3.connect(f"file:{path_uri}?mode=ro", uri=True)
            try:
                probe.execute("SELECT count(*) FROM sqlite_master").fetchone()
            finally:
                probe.close()
            return {"mode": "ro"}
        except sqlite3.OperationalError as e:
            if getattr(e, "sqlite_errorname", "") not in {"SQLITE_CANTOPEN", *DISK_FULL_CODES}:
                raise
    wal = path.with_name(f"{path.name}-wal")
    if not wal.exists() or wal.stat().st_size == 0:
        return {"immutable": "1"}  # no log to lose: the main file is the whole ledger
    if disk_full(path):
        raise LocalDiskError(
            f"ledger {path} has a write-ahead log ({wal.name}) that a writer left, and its disk is full, "
            "so SQLite has no room for the index it needs to read it: free some space on that disk "
            "(a local disk error)"
        )
    raise HomeReadOnly(
        f"ledger {path} has a write-ahead log ({wal.name}) but no {path.name}-shm, and its "
        "directory is read-only, so SQLite cannot read it here; open it once read-write (any "
        "frt-mirror command where the home is writable) to fold the log into the ledger"
    )


def quick_read(
    path: Path, versions: dict[str, int], tables: frozenset[str], read: Callable[[sqlite3.Connection], T | None]
) -> T | None:
    """`read(conn)` on a read-only connection to the ledger at `path`, in one read transaction (one
    snapshot), where each version table named in `versions` holds exactly its version and every one of
    `tables` is there (the ledger's own open refuses a schema missing one: migrations._check_tables); else
    None, as where `read` returns None (it cannot answer exactly) or raises any sqlite3 error."""
    try:
        if path.stat().st_size == 0:  # empty, or a WAL ledger not yet checkpointed: the ledger's path decides
            return None
        path_uri = uri(path)
        params = "&".join(f"{k}={v}" for k, v in read_only_params(path, path_uri).items())
        conn = sqlite3.connect(f"file:{path_uri}?{params}", uri=True, isolation_level=None)
    except (OSError, sqlite3.Error, HomeReadOnly, LocalDiskError):  # the ledger's own path says it in one line
        return None
    try:
        conn.execute("BEGIN")
        for table, version in versions.items():
            if conn.execute(f"SELECT max(version) FROM {table}").fetchone() != (version,):  # noqa: S608 (our names)
                return None
        have = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not tables <= have:
            return None
        return read(conn)
    except sqlite3.Error:  # the ledger's own path reads it, or says in one line what is wrong
        return None
    finally:
        conn.close()
