"""The catalog a `serve` process answers from, reloaded when the ledger says something changed.

Replicas (several processes, several hosts) share one ledger and store and keep no state of their own:
each polls the ledger's change serial (one primary-key read, every FRT_SERVE_POLL seconds, default 1)
and reloads its catalog when the serial moves, so what a stager stages or an import imports is
answered everywhere within about a second, with no restart and no reload per request.
"""

from __future__ import annotations

import os
import sys
import threading

from frt.resolver.errors import FrtError
from frt.resolver.settings import env_number

from ..home import Home
from ..records import change_serial
from .catalog import Catalog, load_catalog


class CatalogWatcher:
    """Call it for the current catalog. The poller is a daemon thread started on first use in each
    process: a worker forked after this was built gets its own (and its own ledger connections)."""

    def __init__(self, home: Home, trust_override: frozenset[str] = frozenset(), interval: float | None = None):
        self.home, self.trust_override = home, trust_override
        self.interval = env_number("FRT_SERVE_POLL", 1.0) if interval is None else interval
        self._serial = change_serial(home.ledger)  # read before the load: a change between is seen next poll
        self._catalog = load_catalog(home, trust_override)
        self._pid: int | None = None
        self._stop = threading.Event()
        self._failing = False

    def __call__(self) -> Catalog:
        if self._pid != os.getpid():
            self._start()
        return self._catalog

    def check(self) -> bool:
        """Reload now if the serial moved; whether it did."""
        serial = change_serial(self.home.ledger)
        if serial == self._serial:
            return False
        catalog = load_catalog(self.home, self.trust_override)
        self._catalog, self._serial = catalog, serial
        return True

    def stop(self) -> None:
        self._stop.set()

    def _start(self) -> None:
        if self._pid is not None:  # forked: the parent's pooled connections are not this process's
            self.home.ledger.engine.dispose(close=False)
        self._pid = os.getpid()
        threading.Thread(target=self._poll, name="frt-catalog-watch", daemon=True).start()

    def _poll(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check()
            except FrtError as e:  # the ledger's server restarting: keep answering what we have
                if not self._failing:
                    print(f"frt-mirror: warning: cannot check the ledger for changes ({e}); still serving "
                          "the catalog loaded before", file=sys.stderr, flush=True)
                self._failing = True
            else:
                if self._failing:
                    print("frt-mirror: the ledger answers again", file=sys.stderr, flush=True)
                self._failing = False
