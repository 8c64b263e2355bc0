"""A mirror's home: the `Home` object that owns its ledger, store and views. Where a home is, and
whether this host may write it, is home_path.py (the CLI asks that before it imports any of this)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from frt.resolver.errors import BadInput, LedgerCorrupt
from frt.resolver.ledger_file import cannot_write, disk_full, quick_read

from ..home_path import check_home, check_not_forgotten, default_ledger_url, default_store_url, ledger_path
from .staged import QUICK_TABLES, QUICK_VERSIONS, StagedRow, read_staged

if TYPE_CHECKING:  # imported where used: `env` on a job start reads a home without SQLAlchemy (staged.py)
    from frt.resolver.ledger import Ledger
    from frt.resolver.refusal_records import RefusalRecord
    from frt.resolver.resolution import FileEntry

    from .protocol import BlobStore
    from .view_trees import Views

T = TypeVar("T")


def open_ledger(where: Path | str, readonly: bool | None = None) -> Ledger:
    """A ledger with the mirror's tables beside the resolver's (migrated, or checked when read-only)."""
    from frt.resolver.ledger import Ledger

    from ..schema import MIRROR_TRACK

    return Ledger(where, readonly=readonly, tracks=(MIRROR_TRACK,))


class Home:
    """One home: its ledger, its blob store and its views, and the few questions everyone asks of
    them. The CLI, `serve`, bundle/import, verify, env/export-cache and `frt.seats` take a Home; none
    of them builds a store or a view of its own. Where the ledger lives is this object's setting: an
    open `Ledger` handed in, else `ledger_url` (default $FRT_LEDGER_URL: a database server several
    hosts share, beside a home on a shared filesystem), else the home's SQLite file; opened on first
    use (read-only where the home cannot be written, or when `readonly=True`)."""

    def __init__(
        self,
        root: Path | str,
        *,
        ledger: Ledger | None = None,
        readonly: bool | None = None,
        ledger_url: str | None = None,
        store_url: str | None = None,
        rebuilding: bool = False,
    ):
        self.root = Path(root)
        check_home(self.root)
        self._ledger, self._readonly = ledger, readonly
        self.rebuilding = rebuilding  # `ledger rebuild`: an empty ledger beside the store's records is its input
        # Set by a command that must work on a full disk (verify, report, env, matrix, export-cache; gc and
        # unstage until they have freed space): where the SQLite ledger's disk is full, it is opened
        # read-only, which needs no new space, instead of failing to make SQLite's index (-shm) beside it.
        # Its writes are then skipped (`full`), or wait for `writable_again`.
        self.reads_when_full = False
        self._opened_full = False  # the ledger is open read-only because its disk was full
        self.ledger_url = ledger_url or default_ledger_url()
        # The store as configured (None: files under the home): what this object chooses its store by,
        # and what a process that builds its own Home is handed (serve's replicas). Anything else asks
        # the store what it can do (protocol.py).
        self.store_url = store_url or default_store_url()

    @property
    def ledger(self) -> Ledger:
        if self._ledger is None:
            from .files import store_root

            if not self.ledger_url:
                path = ledger_path(self.root)
                if not self.rebuilding and no_ledger_file(path) and self.store.has_records():  # before creating one
                    raise lost_ledger(str(path), self.store.where, "is missing or empty (0 bytes)")
                check_not_forgotten(self.root, store_root(self.root))
            readonly = self._readonly
            if readonly is None and self._full_here():
                readonly = self._opened_full = True
            ledger = open_ledger(self.ledger_url or ledger_path(self.root), readonly=readonly)
            if not self.rebuilding and ledger_is_empty(ledger) and self.store.has_records():
                where = ledger.where
                ledger.close()
                raise lost_ledger(where, self.store.where, "is empty (no repo, nothing staged)")
            self._ledger = ledger
        return self._ledger

    @property
    def full(self) -> bool:
        """Whether the ledger is (or would be) open read-only because its disk is full (`reads_when_full`)."""
        return self._opened_full if self._ledger is not None else self._full_here()

    def _full_here(self) -> bool:
        return self.reads_when_full and not self.ledger_url and disk_full(ledger_path(self.root))

    def writable_again(self) -> bool:
        """After this command freed space (gc, unstage): whether its ledger can be written now. One opened
        read-only for a full disk is closed, to be opened read-write on next use, where there is room now;
        False where the disk is still full (the caller then skips its writes and says so)."""
        if not self.full:
            return not self.readonly
        if disk_full(ledger_path(self.root)):
            return False
        if self._ledger is not None:
            self._ledger.close()
            self._ledger = None
        self._opened_full = self.reads_when_full = False
        return True

    @cached_property
    def store(self) -> BlobStore:
        on_server = self.ledger_url or (self._ledger is not None and self._ledger.url)  # several hosts
        # Not self.ledger.named_lock itself: that would open the ledger now, and serve reads the store
        # (its catalog's blob paths) while a ledger server is down.
        shared = (lambda name, **kw: self.ledger.named_lock(name, **kw)) if on_server else None
        if self.store_url is None:
            from .files import FileBlobStore

            return FileBlobStore(self.root, shared_lock=shared)
        if not on_server or _is_sqlite(self.ledger_url):
            raise BadInput(
                f"--store {self.store_url}: the ledger must be on a database server that every host shares "
                "(--ledger postgresql+psycopg://… or FRT_LEDGER_URL), not a SQLite file"
            )
        from .s3 import S3BlobStore  # obstore only where an object store is used

        return S3BlobStore(self.store_url, self.root, shared_lock=shared)

    @cached_property
    def views(self) -> Views | None:
        """The build/<variant> trees of hard links into the store, or None where its blobs are not files
        on this host (an object store: `env --into` writes a target's files instead)."""
        from .view_trees import Views

        files = self.store.files
        return Views(self.root, files) if files is not None else None

    def blob_for(self, entries: Iterable[FileEntry]) -> dict[FileEntry, str | None]:
        from .records import blob_for

        return blob_for(self.ledger, entries)

    def staged(self, target: str | None = None) -> list[StagedRow]:
        """Rows staged for `target` (with the pulled-through variants it accepts), or every row. For a
        target, the quick read where it can answer (staged.py)."""
        if target is not None and (quick := self.quick(lambda conn: read_staged(conn, target))) is not None:
            return quick
        from .records import staged_for, staged_rows

        return staged_for(self.ledger, target) if target is not None else staged_rows(self.ledger)

    def refusals(self) -> list[RefusalRecord]:
        """Every refusal on record, newest first; the quick read where it can answer, as for staged rows."""
        from frt.resolver.refusal_records import read_refusals

        quick = self.quick(read_refusals)
        return quick if quick is not None else self.ledger.refusals()

    def quick(self, read: Callable[[sqlite3.Connection], T | None]) -> T | None:
        """`read` of a SQLite ledger not opened here yet, with sqlite3 alone (ledger_file.quick_read); None
        where only the ledger's own path can answer, a ledger server's always."""
        if self._ledger is not None or self.ledger_url:
            return None
        return quick_read(ledger_path(self.root), QUICK_VERSIONS, QUICK_TABLES, read)

    @property
    def ledger_on_server(self) -> bool:
        """Whether the ledger is a database server's (several hosts share it, and it can be down while this
        home is here), not a SQLite file."""
        return bool(self.ledger_url) and not _is_sqlite(self.ledger_url)

    @property
    def readonly(self) -> bool:
        """Whether the ledger is open read-only here, or would be: a SQLite one not opened yet is not opened
        to ask (Ledger's rule: the `readonly` given, else whether this process can write the file)."""
        if self._ledger is None and not self.ledger_url:
            if self._readonly is not None:
                return self._readonly
            return cannot_write(ledger_path(self.root)) or self._full_here()
        return self.ledger.readonly

    def close(self) -> None:
        if self._ledger is not None:
            self._ledger.close()

    def __str__(self) -> str:
        return str(self.root)


def no_ledger_file(path: Path) -> bool:
    """No SQLite ledger there, or a 0-byte one (what SQLite would open as a new, empty database)."""
    wal = path.with_name(path.name + "-wal")
    try:
        return path.stat().st_size == 0 and (not wal.exists() or wal.stat().st_size == 0)
    except FileNotFoundError:
        return True


def lost_ledger(ledger: str, store: str, state: str) -> LedgerCorrupt:
    """The one line every command says for a ledger lost beside a store that records what was staged."""
    return LedgerCorrupt(
        f"ledger {ledger} {state}, but the store {store} records what was staged: run "
        "'frt-mirror ledger rebuild' to make the ledger again from it (offline), then run this again"
    )


def ledger_is_empty(ledger: Ledger) -> bool:
    """No repo and no staged row: a new ledger, or one that lost everything (a stage always records both)."""
    from sqlalchemy import select

    from frt.resolver.ledger.schema import Repo

    from ..schema import Staged

    with ledger.session(write=False) as s:
        return s.scalar(select(Repo.id).limit(1)) is None and s.scalar(select(Staged.id).limit(1)) is None


def _is_sqlite(url: str | None) -> bool:
    """Is `url` (a --ledger / FRT_LEDGER_URL text) a SQLite file's, one host's ledger?"""
    return bool(url) and str(url).split(":", 1)[0].split("+", 1)[0].lower() == "sqlite"
