"""Where a mirror's home is (--home, else $FRT_MIRROR_HOME, else the platform's user data dir), where
its SQLite ledger lies, and whether this host may write it: nothing here opens the ledger, so the CLI
asks it without importing SQLAlchemy."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from frt.resolver.errors import BadInput, HomeReadOnly, LedgerCorrupt

# The mirror's schema version (schema.py migrates a ledger to it) and its tables at that version: here,
# where a quick read of the SQLite ledger (store/staged.py) checks them without importing SQLAlchemy.
MIRROR_VERSION = 7
MIRROR_TABLES = frozenset(
    {"blobs", "demand", "mirror_changes", "mirror_events", "mirror_schema_migrations", "pulled_blobs", "staged"}
    | {"staged_wheels", "tokens", "wheels", "withdrawn"}
)


@dataclass(frozen=True)
class HomeLayout:
    """The home's folders, named once: everything that builds a path in a home asks this."""

    root: Path

    @property
    def ledger(self) -> Path:  # the SQLite ledger (a ledger server's URL replaces it: default_ledger_url)
        return self.root / "ledger.sqlite"

    @property
    def store(self) -> Path:  # blobs by sha256 as files (store/files.py), `<sha[:2]>/<sha>`
        return self.root / "store" / "sha256"

    @property
    def records(self) -> Path:  # what a ledger rebuild reads, beside the blobs (store/row_records.py)
        return self.root / "store" / "records"

    @property
    def tmp(self) -> Path:  # `.part` files of downloads and imports in flight
        return self.root / "tmp"

    @property
    def locks(self) -> Path:  # one file lock per blob being written
        return self.root / "locks"

    @property
    def views(self) -> Path:  # LOCAL_KERNELS' variant folders, hard links into the store
        return self.root / "views" / "local"

    @property
    def views_tmp(self) -> Path:  # views being assembled, renamed into `views` whole
        return self.root / "views" / ".tmp"

    @property
    def wheels(self) -> Path:  # python-depends' wheels, a pip find-links folder of hard links
        return self.root / "views" / "wheels"

    @property
    def quarantine(self) -> Path:  # blobs serve found changed on disk, set aside (serve/integrity.py)
        return self.root / "quarantine"

    @property
    def catalog_snapshot(
        self,
    ) -> Path:  # serve's last catalog, what a serve started during a ledger outage answers from
        return self.root / "catalog.json"

    @property
    def python(self) -> Path:  # `env --engine`'s default --python-dir
        return self.root / "python"


def check_home(root: Path) -> None:
    """One line for a home that cannot be one, the same whichever command asks first: before, each found
    its own OSError on the way (`…/store/sha256: Not a directory`, `File exists`, nothing at all)."""
    layout = HomeLayout(root)
    if root.is_symlink() and not root.exists():
        _unusable(root, f"{root} is a link to {os.readlink(root)}, which does not exist")
    for above in (root, *root.parents):
        if above.exists() or above.is_symlink():
            if not above.is_dir():
                _unusable(root, f"{above} is a file, not a directory")
            break
    folders = (layout.store.parent, layout.store, layout.records, layout.tmp, layout.locks, layout.views.parent,
               layout.views, layout.views_tmp, layout.wheels, layout.quarantine, layout.python)  # fmt: skip
    for folder in folders:
        if (folder.exists() or folder.is_symlink()) and not folder.is_dir():
            _unusable(root, f"{folder} is not a directory")


def check_existing_home(root: Path, ledger_url: str | None) -> None:
    """A command that only reads a home refuses one that is not there, rather than create it, empty, and
    answer "nothing staged" or "0 blobs … ok" (a mistyped --home in a cron job's verify would pass forever).
    With the ledger on a database server, the home is this host's scratch folders: the server is the record."""
    check_home(root)
    if ledger_url:
        return
    create = "stage or import creates a home; --home DIR or FRT_MIRROR_HOME names another"
    if not root.is_dir():
        raise BadInput(f"no frt-mirror home at {root}: nothing was staged or imported there ({create})")
    layout = HomeLayout(root)
    if not layout.ledger.exists() and not layout.store.exists():  # a store without its ledger: check_not_forgotten
        raise BadInput(
            f"home {root} has no ledger ({layout.ledger.name}) and no store: nothing was staged or imported there "
            f"({create})"
        )


def _unusable(root: Path, why: str) -> None:
    raise BadInput(f"home {root} is not usable: {why}")


def default_home() -> Path:
    if env := os.environ.get("FRT_MIRROR_HOME"):
        return Path(env)
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "frt-mirror"
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local")) / "frt-mirror"
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "frt-mirror"


def ledger_path(home: Path) -> Path:
    return HomeLayout(home).ledger


def check_writable(home: Path, what: str) -> None:
    """A command that writes the home, refused in one line where the home is read-only (a cluster's
    shared mount) rather than failing on its first write. access() says EROFS on a read-only mount
    even to root. A home that does not exist yet is left to be created (or to fail saying why)."""
    ledger = ledger_path(home)
    writable = os.access(home, os.W_OK) and (not ledger.exists() or os.access(ledger, os.W_OK))
    if home.is_dir() and not writable:
        raise HomeReadOnly(f"home {home} is read-only here, and {what}: run it where the home is mounted read-write")


def default_ledger_url() -> str | None:
    """$FRT_LEDGER_URL: the ledger on a database server (postgresql://…) shared by several hosts; unset,
    the home's own SQLite file."""
    text = os.environ.get("FRT_LEDGER_URL") or None
    return text and check_ledger_text(text, where="FRT_LEDGER_URL")


def check_ledger_text(text: str, *, where: str) -> str:
    """A ledger URL as given (--ledger, FRT_LEDGER_URL) is a URL: `garbage` or `postgres-typo@db:5432/frt`
    was taken for a file name, and a SQLite ledger of that name was created in the working directory.
    Its dialect and the rest are checked where it is opened (resolver/ledger/open.py ledger_url), which
    needs SQLAlchemy; this needs nothing."""
    scheme, sep, _ = text.partition("://")
    if not sep or not scheme:
        raise BadInput(
            f"{where} {text!r} is not a ledger URL: expected postgresql://USER@HOST:PORT/DB or sqlite:///PATH"
        )
    return text


def check_not_forgotten(home: Path, blobs: Path) -> None:
    """Refuse an empty (0-byte) SQLite ledger beside a store that holds blobs: SQLite opens it as a new
    database, so what was staged would be silently forgotten (and verify would say ok). A 0-byte main
    file with a write-ahead log is a WAL ledger not yet checkpointed, not an empty one."""
    ledger = ledger_path(home)
    wal = ledger.with_name(ledger.name + "-wal")
    try:
        empty = ledger.stat().st_size == 0 and (not wal.exists() or wal.stat().st_size == 0)
    except OSError:  # no ledger (a new home, or its ledger removed on purpose), or no home: said on open
        return
    if empty and any(p.is_file() for p in blobs.glob("??/*")):
        raise LedgerCorrupt(
            f"ledger {ledger} is empty (0 bytes) but the store {blobs} holds blobs: the record "
            "of what was staged is gone. Restore it from a backup; or remove the empty file to "
            "start a new ledger over these blobs (frt-mirror verify then adopts them; stage or "
            "import again to record what is staged: blobs already here are not fetched again)"
        )


STORE_SCHEME = "s3://"


def check_store_url(text: str, *, where: str) -> str:
    """`s3://BUCKET[/PREFIX]` as given (--store, FRT_STORE_URL); one line naming what is wrong otherwise."""
    if not text.startswith(STORE_SCHEME):
        raise BadInput(f"{where}: {text!r} is not an s3://BUCKET/PREFIX URL (the only object store frt-mirror knows)")
    bucket, _, prefix = text[len(STORE_SCHEME) :].partition("/")
    if not bucket or any(c in bucket for c in "?#\\ ") or any(p in (".", "..") for p in prefix.split("/")):
        raise BadInput(f"{where}: {text!r}: expected s3://BUCKET/PREFIX (a bucket name, then an optional prefix)")
    return text.rstrip("/")


def default_store_url() -> str | None:
    text = os.environ.get("FRT_STORE_URL") or None
    return text and check_store_url(text, where="FRT_STORE_URL")
