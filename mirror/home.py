"""A mirror's home: where it is (--home, else $FRT_MIRROR_HOME, else the platform's user data dir), and
the `Home` object that owns its ledger, store and views."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from functools import cached_property
from pathlib import Path

from frt.resolver import Ledger
from frt.resolver.errors import HomeReadOnly
from frt.resolver.resolution import FileEntry

from .records import StagedRow, blob_for, staged_for, staged_rows
from .schema import MIRROR_TRACK
from .store import BlobStore
from .views import Views


def default_home() -> Path:
    if env := os.environ.get("FRT_MIRROR_HOME"):
        return Path(env)
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "frt-mirror"
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local")) / "frt-mirror"
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "frt-mirror"


def ledger_path(home: Path) -> Path:
    return home / "ledger.sqlite"


def check_writable(home: Path, what: str) -> None:
    """A command that writes the home, refused in one line where the home is read-only (a cluster's
    shared mount) rather than failing on its first write. access() says EROFS on a read-only mount
    even to root. A home that does not exist yet is left to be created (or to fail saying why)."""
    ledger = ledger_path(home)
    writable = os.access(home, os.W_OK) and (not ledger.exists() or os.access(ledger, os.W_OK))
    if home.is_dir() and not writable:
        raise HomeReadOnly(f"home {home} is read-only here, and {what}: run it where the home is mounted "
                           "read-write")


def default_ledger_url() -> str | None:
    """$FRT_LEDGER_URL: the ledger on a database server (postgresql://…) shared by several hosts; unset,
    the home's own SQLite file."""
    return os.environ.get("FRT_LEDGER_URL") or None


def open_ledger(where: Path | str, readonly: bool | None = None) -> Ledger:
    """A ledger with the mirror's tables beside the resolver's (migrated, or checked when read-only)."""
    return Ledger(where, readonly=readonly, tracks=(MIRROR_TRACK,))


class Home:
    """One home: its ledger, its blob store and its views, and the few questions everyone asks of
    them. The CLI, `serve`, bundle/import, verify, env/export-cache and `frt.seats` take a Home; none
    of them builds a store or a view of its own. Where the ledger lives is this object's setting: an
    open `Ledger` handed in, else `ledger_url` (default $FRT_LEDGER_URL: a database server several
    hosts share, beside a home on a shared filesystem), else the home's SQLite file; opened on first
    use (read-only where the home cannot be written, or when `readonly=True`)."""

    def __init__(self, root: Path | str, *, ledger: Ledger | None = None, readonly: bool | None = None,
                 ledger_url: str | None = None):
        self.root = Path(root)
        self._ledger, self._readonly = ledger, readonly
        self.ledger_url = ledger_url or default_ledger_url()

    @property
    def ledger(self) -> Ledger:
        if self._ledger is None:
            self._ledger = open_ledger(self.ledger_url or ledger_path(self.root), readonly=self._readonly)
        return self._ledger

    @cached_property
    def store(self) -> BlobStore:
        on_server = self.ledger_url or (self._ledger is not None and self._ledger.url)  # several hosts
        shared = self.ledger.named_lock if on_server else None
        return BlobStore(self.root, shared_lock=shared)

    @cached_property
    def views(self) -> Views:
        return Views(self.root, self.store)

    def blob_for(self, entries: Iterable[FileEntry]) -> dict[FileEntry, str | None]:
        return blob_for(self.ledger, entries)

    def staged(self, target: str | None = None) -> list[StagedRow]:
        """Rows staged for `target` (with the pulled-through variants it accepts), or every row."""
        return staged_for(self.ledger, target) if target is not None else staged_rows(self.ledger)

    def close(self) -> None:
        if self._ledger is not None:
            self._ledger.close()

    def __str__(self) -> str:
        return str(self.root)
