"""`serve --workers N`: N forked processes answering on the sockets serve bound, one supervisor.

Each worker accepts on the same listening sockets (bound once by the parent, so a busy port is still
one line and exit 2 before any worker exists) and builds its own app after the fork: its own ledger
connection and catalog, its own access-log sink (whole lines appended, so the workers' lines
interleave but never split). The parent restarts a worker that dies, and on SIGINT (Ctrl-C) or
SIGTERM stops them all with SIGTERM (uvicorn's graceful shutdown: requests in flight are finished).

Why not uvicorn's own supervisor (`uvicorn.supervisors.Multiprocess`, which takes bound sockets too):
it spawns each worker as a fresh interpreter, which re-imports this CLI (about a second each, more on a
busy machine); its constructor changed between uvicorn releases (`target` went away); and a Ctrl-C
landing while a worker is still importing printed that worker's KeyboardInterrupt traceback. A forked
worker starts from the parent's imports, and ignores SIGINT until uvicorn takes the signal over.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from frt.resolver.errors import EXIT_BAD_INPUT, EXIT_UNAVAILABLE, BadInput, FrtError

from ..store.home import Home
from .accesslog import AccessLog, open_sink
from .app import MirrorApp
from .blob import FileIntegrity
from .catalog import Catalog
from .demand_rollup import Forwarder, self_origin
from .head_map import HeadMap
from .objects import ObjectIntegrity
from .pull import Upstream
from .run import make_app, serve
from .watch import CatalogWatcher

if TYPE_CHECKING:
    from types import FrameType

STOP = (signal.SIGINT, signal.SIGTERM)


@dataclass(frozen=True)
class AppSpec:
    """What serve's app is built from, so that each worker builds its own."""

    root: Path
    trust: frozenset[str] = frozenset()
    access_log: str | None = None  # FILE, "-" (stdout) or None (stderr): see open_sink
    accel_redirect: str | None = None  # nginx's internal location over the store (serve --accel-redirect)
    ledger_url: str | None = None  # the ledger on a server (--ledger), else the home's SQLite file
    upstream: Upstream | None = None  # serve --upstream: pull-through
    demand_clients: bool = False  # serve --demand-log-clients: the demand counts keep client addresses
    head_map: Path | None = None  # serve --head-map: nginx's run dir, where the HEAD answers go (head_map.py)
    store_url: str | None = None  # --store s3://…: the blobs are objects (objects.py)
    s3_redirect: bool = False  # serve --s3-redirect: a GET is a 302 to the object's presigned URL
    origin: str = ""  # how the upstream names this serve in the demand it is handed (demand_rollup.py)

    def build(self, home: Home, fallback: Catalog | None = None) -> MirrorApp:
        """Raises BadInput where the access log cannot be opened. `fallback`: the catalog to start from
        if the ledger does not answer now (the parent's, for a worker restarted during an outage)."""
        try:
            sink = open_sink(self.access_log)
        except OSError as e:
            raise BadInput(f"cannot open the access log {self.access_log}: {e.strerror}") from None
        app = make_app(home, self.trust, log=AccessLog(sink), fallback=fallback, demand_clients=self.demand_clients)
        app.accel_redirect = self.accel_redirect
        if self.s3_redirect:
            assert isinstance(app.integrity, ObjectIntegrity)  # serve_cmd refuses it without --store
            app.integrity.redirect = True
        if self.upstream is not None:
            app.pull = self.upstream.service(home, app.metrics)
            app.demand.forward = Forwarder(self.upstream.endpoint, self.origin or self_origin())
            if (cache := app.pull.pull.cache) is not None:  # answers lease their blob; an evicted one is pulled again
                assert isinstance(app.integrity, FileIntegrity)  # serve refuses a cache cap over an object store
                app.integrity.cache = cache
        if self.head_map is not None:
            watch_head_map(app, self.head_map)
        return app


def watch_head_map(app: MirrorApp, run_dir: Path) -> None:
    """Write nginx's map of HEAD answers now, and again whenever a poll finds the catalog changed."""
    watcher = app.catalog
    assert isinstance(watcher, CatalogWatcher)  # make_app's (run.py)
    pull = app.pull
    heads = HeadMap(
        run_dir,
        skip_repo=lambda repo_id: pull is not None and pull.allowed(repo_id),
    )
    heads.update(watcher.current, app.integrity.bad)
    watcher.listeners.append(lambda catalog: heads.update(catalog, app.integrity.bad))


def serve_workers(
    spec: AppSpec,
    sockets: list[socket.socket],
    workers: int,
    catalog: Catalog | None = None,
    ready: Callable[[], object] | None = None,
    stopping: Callable[[], object] | None = None,
) -> tuple[int, str | None]:
    """Run `workers` workers until SIGINT or SIGTERM; the exit code: 0, or EXIT_UNAVAILABLE when a
    worker could not build its app (the home went away: restarting it would not help), EXIT_BAD_INPUT when
    one could not listen (the port taken meanwhile), and the signal that stopped them (None: none did).
    `catalog`: what a worker starts from when the ledger does not answer (a worker restarted during an
    outage). `ready`: called once every worker accepts (see _Ready); `stopping`: at the first signal."""
    pids: set[int] = set()
    signals: list[int | None] = []  # None: stopped for a worker's exit code, not a signal
    code = 0
    told = _Ready(workers, ready)

    def stop(signum: int | None, _frame: FrameType | None) -> None:
        if not signals and stopping is not None:
            stopping()
        signals.append(signum)
        for pid in pids:
            _kill(pid)

    def start() -> None:
        pid = _fork(spec, sockets, catalog, told.fd)
        pids.add(pid)
        if signals:  # the signal came between the fork and here
            _kill(pid)

    previous = {s: signal.signal(s, stop) for s in STOP}
    try:
        for _ in range(workers):
            start()
        while pids:
            pid, status = told.wait(pids)  # retried after a signal's handler has run (PEP 475)
            pids.discard(pid)
            if signals:
                continue
            if os.WIFEXITED(status) and os.WEXITSTATUS(status) in (EXIT_UNAVAILABLE, EXIT_BAD_INPUT):
                code = os.WEXITSTATUS(status)
                stop(None, None)
                continue
            how = (
                f"was killed by {signal.Signals(os.WTERMSIG(status)).name}"
                if os.WIFSIGNALED(status)
                else f"exited {os.WEXITSTATUS(status)}"
            )
            print(f"frt-mirror: worker {pid} {how}; starting another", file=sys.stderr, flush=True)
            start()
    finally:
        told.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    by = next((signal.Signals(s).name for s in signals if s is not None), None)
    return code, by


class _Ready:
    """Readiness with --workers: ready once every worker can answer, not when the first can. Each worker,
    once its uvicorn accepts (its own catalog loaded, run.py's serve), writes its pid on a pipe to the
    parent; the parent, waiting for its workers' exits meanwhile, counts the pids of live workers that
    wrote, and when they are all `n` of them, calls `ready` (the ready file, READY=1) and closes the pipe.
    A worker that died before it said so is replaced and its replacement counts instead; workers started
    after that (one restarted later) have nothing to say. No thread: the parent forks workers again, and
    a thread caught in a lock at a fork leaves the child that lock held."""

    def __init__(self, n: int, ready: Callable[[], object] | None):
        self.n, self.ready = n, ready
        self.said: set[int] = set()
        self.fd: int | None = None  # the pipe's write end, what each worker forked from here inherits
        if ready is not None:
            self._read, self.fd = os.pipe()

    def wait(self, pids: set[int]) -> tuple[int, int]:
        """os.wait(); until all are ready, in steps of 0.1 s that read the pipe between them."""
        while self.fd is not None:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid:
                return pid, status
            if select.select([self._read], [], [], 0.1)[0]:
                self.said.update(int(w) for w in os.read(self._read, 4096).split())
                if len(self.said & pids) >= self.n:
                    self.close()
                    assert self.ready is not None
                    self.ready()
        return os.wait()

    def close(self) -> None:
        if self.fd is not None:
            os.close(self._read)
            os.close(self.fd)
            self.fd = None


def _fork(spec: AppSpec, sockets: list[socket.socket], catalog: Catalog | None, ready: int | None) -> int:
    parent = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    # First, before the parent's `stop` handler could run here: until uvicorn installs its handlers, a
    # Ctrl-C is the parent's to act on; the SIGTERM it then sends ends a worker not serving yet, silently.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _end_with(parent)
    code = _worker(spec, sockets, catalog, ready)
    sys.stderr.flush()
    os._exit(code)  # never back into the parent's click command and its cleanup


def _worker(spec: AppSpec, sockets: list[socket.socket], catalog: Catalog | None, ready: int | None) -> int:
    try:
        app = spec.build(Home(spec.root, ledger_url=spec.ledger_url, store_url=spec.store_url), fallback=catalog)
    except (FrtError, OSError) as e:
        print(f"frt-mirror: worker {os.getpid()}: {e}", file=sys.stderr)
        return EXIT_UNAVAILABLE

    def say_ready() -> None:
        if ready is not None:
            with contextlib.suppress(OSError):  # the parent stopped listening: it was told by the others
                os.write(ready, f"{os.getpid()}\n".encode())
            os.close(ready)

    try:
        serve(app, sockets, ready=say_ready)
    except BadInput as e:  # its sockets cannot listen (listen.py)
        print(f"frt-mirror: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BaseException:  # a bug: say where
        traceback.print_exc()
        return 1
    return 0


def _end_with(parent: int) -> None:
    """A worker whose parent is gone (kill -9) gets SIGTERM, rather than holding the port on its own."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # it died before prctl took effect
        os._exit(0)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
