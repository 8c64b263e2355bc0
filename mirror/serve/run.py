"""The app over a home, and uvicorn running it on sockets already bound."""

from __future__ import annotations

import logging
import socket

from ..home import Home
from ..tokens import TokenCheck
from .accesslog import AccessLog
from .app import MirrorApp
from .catalog import Catalog
from .watch import CatalogWatcher, LedgerCollector
from .metrics import Metrics
from .page import OperatorRoutes

KEEP_ALIVE_S = 75


def make_app(home: Home, trust_override: frozenset[str] = frozenset(), log: AccessLog | None = None,
             fallback: Catalog | None = None) -> MirrorApp:
    """The app over `home`; its catalog follows the ledger's changes (see watch.py), and starts from
    `fallback` when the ledger does not answer now. It answers the operator's page and /metrics too
    (page.py, metrics.py)."""
    watcher = CatalogWatcher(home, trust_override, fallback=fallback)
    app = MirrorApp(watcher, TokenCheck(lambda: watcher().tokens), log)
    app.metrics = Metrics(home)
    app.metrics.registry.register(LedgerCollector(watcher))
    app.operator = OperatorRoutes(home, app.metrics, watcher)
    return app


def serve(app: MirrorApp, sockets: list[socket.socket]) -> None:
    """Run uvicorn on sockets already bound (see listen.py); then write out the access log's last lines."""
    import uvicorn

    from .stream import CutSaid

    # A client's pool leaves a connection idle between a HEAD and its GET, seconds on a busy node;
    # uvicorn's default 5 s keep-alive closed it under a GET being sent (RemoteProtocolError). nginx's 75 s.
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on", server_header=False,
                            date_header=True, timeout_keep_alive=KEEP_ALIVE_S)
    logging.getLogger("uvicorn.error").addFilter(CutSaid())  # after Config, which configures uvicorn's loggers
    try:
        uvicorn.Server(config).run(sockets=sockets)
    finally:
        if app.log:
            app.log.sink.close()
