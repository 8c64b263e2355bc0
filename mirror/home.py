"""Where a mirror keeps its state: --home, else $FRT_MIRROR_HOME, else the platform's user data dir."""

from __future__ import annotations

import os
import sys
from pathlib import Path


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
