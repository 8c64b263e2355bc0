"""The app over a home, and uvicorn running it on sockets already bound."""

from __future__ import annotations

import functools
import logging
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass

from ..store.home import Home
from .accesslog import AccessLog
from .app import MirrorApp
from .blob import FileIntegrity
from .catalog import Catalog
from .demand import DemandRecorder
from .demand_records import record_demand
from .limits import HttpLimits, guarded, raise_open_files
from .listen import listen
from .metrics import Metrics
from .objects import ObjectIntegrity
from .page import OperatorRoutes
from .sendfile import hot_get
from .tokens import TokenCheck
from .watch import CatalogWatcher, LedgerCollector


def make_app(
    home: Home,
    trust_override: frozenset[str] = frozenset(),
    log: AccessLog | None = None,
    fallback: Catalog | None = None,
    demand_clients: bool = False,
) -> MirrorApp:
    """The app over `home`; its catalog follows the ledger's changes (see watch.py), and starts from
    `fallback` when the ledger does not answer now. It answers the operator's page and /metrics too
    (page.py, metrics.py), and counts what kernels clients ask for into the ledger (demand.py;
    `demand_clients`: with each client's address)."""
    watcher = CatalogWatcher(home, trust_override, fallback=fallback)
    app = MirrorApp(watcher, TokenCheck(lambda: watcher().tokens), log)
    app.metrics = Metrics(home)
    app.metrics.registry.register(LedgerCollector(watcher))
    if (objects := home.store.objects) is not None:  # streamed from the store, verified the same (objects.py)
        app.integrity = ObjectIntegrity(objects, app.metrics, home=home)
    else:
        app.integrity = FileIntegrity(home, app.metrics)  # bad blobs: moved out, counted, recorded (integrity.py)
    app.operator = OperatorRoutes(home, app.metrics, watcher)
    app.demand = DemandRecorder(lambda tallies: record_demand(home.ledger, tallies), clients=demand_clients)
    return app


@dataclass(frozen=True)
class Stopped:
    """How a serve ended: on `signal` (SIGTERM, SIGINT; None: uvicorn stopped on its own), with `in_flight`
    requests being answered when it came, each of them finished before the end."""

    signal: str | None
    in_flight: int

    def line(self) -> str:
        on = f" on {self.signal}" if self.signal else ""
        return f"stopped{on}: finished the {self.in_flight} request(s) in flight, accepted none after"


def serve(
    app: MirrorApp,
    sockets: list[socket.socket],
    limits: HttpLimits | None = None,
    ready: Callable[[], object] | None = None,
    stopping: Callable[[], object] | None = None,
) -> Stopped:
    """Run uvicorn on sockets already bound (see listen.py) until SIGTERM or SIGINT; then write out the
    access log's last lines. `limits`: the HTTP limits (limits.py); by default those FRT_SERVE_* name (how
    --workers hands them on). `ready`: called once uvicorn accepts on them; `stopping`: at the first signal
    (ready.py's Readiness, or a worker's word to its parent). Raises BadInput where a socket cannot listen."""
    import uvicorn

    class Server(uvicorn.Server):
        stopped_by: str | None = None
        in_flight = 0

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started and ready is not None:
                ready()

        def handle_exit(self, sig: int, frame: object) -> None:  # uvicorn's handler for both signals
            if self.stopped_by is None:
                self.stopped_by, self.in_flight = signal.Signals(sig).name, len(self.server_state.tasks)
                if stopping is not None:
                    stopping()
            super().handle_exit(sig, frame)  # type: ignore[arg-type]

    from .cut import CutSaid

    limits = limits or HttpLimits.from_env()
    app.catalog()  # starts this process's poller now, not at the first request (serve --head-map's writer)
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="on",
        server_header=False,
        date_header=True,
        **{**limits.uvicorn(), "http": guarded(limits, fast=app.fast_head, fast_get=functools.partial(hot_get, app))},
    )
    logging.getLogger("uvicorn.error").addFilter(CutSaid())  # after Config, which configures uvicorn's loggers
    raise_open_files(limits)  # after Config too: a warning it says goes through uvicorn's handler
    # uvicorn's own handler from here on, not only while it runs: a signal before uvicorn takes them (a
    # worker just forked) stops it as soon as it has started, where a no-op would lose it and the worker
    # serve on; and the signal uvicorn re-sends to the handler it found, once stopped, lands here too,
    # where the default would end the process at once, silently, before the caller says it stopped.
    server = Server(config)
    said = {s: signal.signal(s, server.handle_exit) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        # Only now: the app is built, its catalog loaded (listen.py says why not at bind). uvicorn's own
        # listen() on them, as it starts, changes nothing; the connections made meanwhile wait for it.
        listen(sockets)
        server.run(sockets=sockets)
    finally:
        for s, handler in said.items():
            signal.signal(s, handler)
        if app.log:
            app.log.sink.close()
    return Stopped(server.stopped_by, server.in_flight)
