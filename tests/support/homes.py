"""Homes for tests that need one to exist before anything is staged in it."""

from __future__ import annotations

from pathlib import Path


def empty_home(root: Path) -> Path:
    """An existing home with a ledger and nothing staged: what `import` or `stage` leaves before its
    first row. (Reading commands refuse a home that does not exist: they no longer create one.)"""
    from frt.mirror.store.home import Home

    home = Home(root)
    home.ledger.close()  # opened, so created and migrated, then closed
    return root
