"""`frt-mirror serve`: the staged set as a Hub endpoint (uvicorn + an ASGI app, read-only)."""

from __future__ import annotations

import json
from pathlib import Path

from frt.resolver import Ledger

from ..tokens import TokenCheck
from .app import MirrorApp
from .catalog import Catalog, load_catalog

TRUST_FILE = "trust.json"


def trusted_publishers(home: Path) -> frozenset[str]:
    """The publishers the last staged manifest trusted (written by `stage`)."""
    try:
        return frozenset(json.loads((home / TRUST_FILE).read_text()).get("publishers", []))
    except (OSError, ValueError):
        return frozenset()


def make_app(home: Path, ledger: Ledger, trusted: frozenset[str] | None = None) -> MirrorApp:
    catalog: Catalog = load_catalog(home, ledger, trusted if trusted is not None else trusted_publishers(home))
    return MirrorApp(lambda: catalog, TokenCheck(ledger))


def serve(home: Path, ledger: Ledger, *, host: str, port: int, trusted: frozenset[str] | None = None,
          workers_log: bool = True) -> None:
    import uvicorn

    app = make_app(home, ledger, trusted)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False, lifespan="on",
                server_header=False, date_header=True)
