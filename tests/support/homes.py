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


def part_sizes(home: Path, pattern: str = "*.part") -> dict[str, int]:
    """The `.part` files in the home's tmp/ now, by name, with their sizes: what a kill -9 test watches grow
    (a part verified and moved into the store between the listing and its stat is left out)."""
    sizes = {}
    for p in (home / "tmp").glob(pattern):
        try:
            sizes[p.name] = p.stat().st_size
        except FileNotFoundError:
            pass
    return sizes
