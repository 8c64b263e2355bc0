"""`frt-mirror serve`: the staged set as a Hub endpoint (uvicorn + an ASGI app, read-only)."""

from __future__ import annotations

from pathlib import Path

from frt.resolver import Ledger

from ..tokens import TokenCheck
from .app import MirrorApp
from .catalog import Catalog, load_catalog

def make_app(home: Path, ledger: Ledger, trust_override: frozenset[str] = frozenset()) -> MirrorApp:
    catalog: Catalog = load_catalog(home, ledger, trust_override)
    return MirrorApp(lambda: catalog, TokenCheck(ledger))


def serve(home: Path, ledger: Ledger, *, host: str, port: int, trust_override: frozenset[str] = frozenset(),
          workers_log: bool = True) -> None:
    import uvicorn

    app = make_app(home, ledger, trust_override)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False, lifespan="on",
                server_header=False, date_header=True)
