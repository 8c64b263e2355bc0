"""Where a mirror's home is (--home, else $FRT_MIRROR_HOME, else the platform's user data dir), where
its SQLite ledger lies, and whether this host may write it: nothing here opens the ledger, so the CLI
asks it without importing SQLAlchemy."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from frt.resolver.errors import HomeReadOnly


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
