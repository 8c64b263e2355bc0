"""The catalog a `serve` process answers from, reloaded when the ledger says something changed.

Replicas (several processes, several hosts) share one ledger and store and keep no state of their own:
each polls the ledger's change serial (one primary-key read, every FRT_SERVE_POLL seconds, default 1)
and reloads its catalog when the serial moves, so what a stager stages or an import imports is
answered everywhere within about a second, with no restart and no reload per request.

Serving never depends on the ledger being up. Requests read only the catalog in memory (files, refs,
trust, tokens); a poll that fails keeps the last good catalog, says so once per outage on stderr, and
shows it as `frt_mirror_ledger_up 0` on /metrics; the first poll that answers again reloads whatever
changed meanwhile. Starting does not depend on it either, where something was loaded before: a
`--workers` worker restarted mid-outage starts from the catalog its parent loaded (`fallback`), and serve
itself from the catalog snapshot it or a sibling replica wrote beside the home at its last load from a
ledger server (snapshot.py: checked against the store first), saying so in one line. Either way the first
poll that reaches the ledger reloads. Only with neither (no snapshot, one of another format, one the store
does not match) does serve refuse to start, exit 3, in one line that says why the snapshot was not used.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from frt.resolver.errors import FrtError, LedgerUnavailable
from frt.resolver.settings import env_number

from ..store.home import Home
from ..store.records import change_serial
from .catalog import Catalog, load_catalog
from .snapshot import Snapshots, SnapshotUnusable

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric


class CatalogWatcher:
    """Call it for the current catalog. The poller is a daemon thread started on first use in each
    process: a worker forked after this was built gets its own (and its own ledger connections)."""

    def __init__(
        self,
        home: Home,
        trust_override: frozenset[str] = frozenset(),
        interval: float | None = None,
        fallback: Catalog | None = None,
    ):
        self.home, self.trust_override = home, trust_override
        self.interval = env_number("FRT_SERVE_POLL", 1.0) if interval is None else interval
        self._pid: int | None = None
        self._stop = threading.Event()
        # Called with the catalog after each poll that reached the ledger (serve --head-map's writer).
        self.listeners: list[Callable[[Catalog], object]] = []
        self.down_since: float | None = None  # wall time the ledger stopped answering this process
        self.checked_at = time.time()  # wall time the catalog last matched the ledger
        self.snapshots = Snapshots.of(home)  # None: a SQLite ledger, in the home itself
        try:
            self._serial = change_serial(home.ledger)  # read before the load: a change between is seen next poll
            self._catalog = load_catalog(home, trust_override)
        except FrtError as e:
            if fallback is not None:
                self._serial, self._catalog = -1, fallback  # -1: the first poll that reaches the ledger reloads
                self._down(e, "starting from the catalog serve loaded before")
            elif isinstance(e, LedgerUnavailable) and self.snapshots is not None:
                self._from_snapshot(self.snapshots, e)
            else:
                raise
        else:
            self._saved()

    def __call__(self) -> Catalog:
        if self._pid != os.getpid():
            self._start()
        return self._catalog

    @property
    def current(self) -> Catalog:
        """The catalog, without starting this process's poller (what a parent hands the workers it forks)."""
        return self._catalog

    @property
    def ledger_up(self) -> bool:
        return self.down_since is None

    def check(self) -> bool:
        """Reload now if the serial moved; whether it did."""
        serial = change_serial(self.home.ledger)
        moved = serial != self._serial
        if moved:
            catalog = load_catalog(self.home, self.trust_override)
            self._catalog, self._serial = catalog, serial
            self._saved()
        self.checked_at = time.time()
        return moved

    def _saved(self) -> None:
        """The catalog just loaded from the ledger, written beside the home for a start during an outage."""
        if self.snapshots is not None:
            self.snapshots.write(self._catalog, self._serial)

    def _from_snapshot(self, snapshots: Snapshots, e: LedgerUnavailable) -> None:
        """Start from the snapshot, or refuse (exit 3) with the ledger's line and why the snapshot is not used."""
        try:
            snap = snapshots.read(self.trust_override)
        except SnapshotUnusable as why:
            raise LedgerUnavailable(f"{e}; {why}") from None
        self._serial, self._catalog, self.checked_at = -1, snap.catalog, snap.loaded
        print(
            f"frt-mirror: the ledger does not answer ({e}): serving the catalog of {snap.when()} "
            f"(serial {snap.serial}) from {snap.path} until it does",
            file=sys.stderr,
            flush=True,
        )
        self.down_since = time.time()  # said: the poll that reaches the ledger says it answers again

    def stop(self) -> None:
        self._stop.set()

    def _start(self) -> None:
        if self._pid is not None:  # forked: the parent's pooled connections are not this process's
            self.home.ledger.engine.dispose(close=False)
        self._pid = os.getpid()
        threading.Thread(target=self._poll, name="frt-catalog-watch", daemon=True).start()

    def _poll(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll_once()

    def poll_once(self) -> None:
        """One poll; a failure keeps the catalog. A first failure is tried again at once: a server that
        restarted while we were idle fails each pooled connection once, and the pool is emptied then."""
        for attempt in (1, 2):
            try:
                self.check()
            except FrtError as e:
                if attempt == 2:
                    self._down(e, "still serving the catalog loaded before")
            except Exception:  # a bug: say it, keep polling (a dead poller would freeze the catalog)
                if attempt == 2:
                    self._down(RuntimeError(traceback.format_exc(limit=3).strip()), "still serving")
            else:
                if self.down_since is not None:
                    print(
                        f"frt-mirror: the ledger answers again after {time.time() - self.down_since:.1f} s",
                        file=sys.stderr,
                        flush=True,
                    )
                self.down_since = None
                self._tell(self._catalog)
                return

    def _tell(self, catalog: Catalog) -> None:
        for listener in self.listeners:
            try:
                listener(catalog)
            except Exception:  # a bug or a full disk: said, and the poller goes on
                print(f"frt-mirror: warning: {traceback.format_exc(limit=2).strip()}", file=sys.stderr, flush=True)

    def _down(self, e: BaseException, doing: str) -> None:
        if self.down_since is None:  # once per outage
            n = len(self._catalog.repos)
            print(
                f"frt-mirror: warning: the ledger does not answer ({e}); {doing} ({n} repos)",
                file=sys.stderr,
                flush=True,
            )
            self.down_since = time.time()


class LedgerCollector:
    """/metrics: whether this process's last poll reached the ledger, and how old its catalog is."""

    def __init__(self, watcher: CatalogWatcher):
        self.watcher = watcher

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        w = self.watcher
        yield GaugeMetricFamily(
            "frt_mirror_ledger_up",
            "1 while the ledger answers this serve process's polls, "
            "0 during an outage (it serves the catalog it loaded before)",
            value=1 if w.ledger_up else 0,
        )
        yield GaugeMetricFamily(
            "frt_mirror_catalog_age_seconds",
            "Seconds since this process's catalog was last checked against the ledger",
            value=max(0.0, time.time() - w.checked_at),
        )
