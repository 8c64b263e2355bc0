"""serve's metrics: `GET /metrics` in the Prometheus text format, through `prometheus_client`.

What is counted (the README's "Metrics" lists every series):

- every request, by route (one of ROUTES: a fixed set of names, never the raw path, so a client asking
  a million distinct URLs adds no series), method and status, and the body bytes sent per route;
- pull-through's fetches from the upstream (serve --upstream, on a miss), as counts, bytes and duration
  histograms: the pull-through code calls `observe_pull`, a module function that does nothing in a
  process that is not serving; the upstream's rate-limit windows it waited for (`observe_wait`); and
  `frt_mirror_disk_full`, 1 while the home's disk cannot take pulled files (serve/disk.py:
  `observe_disk_full`);
- the home, read from the ledger when scraped (never per Hub request): store bytes and blobs, staged
  variants per target, and the time, files and bytes of the last stage, import, bundle and gc (a stage
  or import run by the CLI shows up there, not in the counters of a serve that did not do it).

The hot path (a HEAD answered by MirrorApp.hot in some tens of microseconds) pays little for this: each
(route, method, status) has its prometheus_client children (the requests counter's, and the bytes
counter's for the route) looked up once and cached, so a request costs a dict lookup and an increment,
written through at once. timeit of a HEAD's `count` on an idle 16-core host: 0.7 µs in one process,
1.2 µs in multiprocess mode, where the increment also takes prometheus_client's lock and writes the
worker's memory-mapped file (a GET with body bytes: 1.1 and 2.3 µs), against 0.3 µs for the in-memory
tally that was flushed once a second before. Nothing is held back in the process: a request is counted
as its answer's last body bytes are handed to the server, just before they go (accesslog.Counted.last,
sendfile.FileSend.finish; a HEAD the protocol answers, before its header lines go).

`serve --workers N`: each worker is its own process and a scrape through the one port lands on any of
them, so per-worker numbers would jump between workers from one scrape to the next (counters seeming
to reset). serve therefore runs prometheus_client's multiprocess mode: it points
PROMETHEUS_MULTIPROC_DIR at a private temporary folder before the workers fork; each worker writes
its counters there, and whichever worker answers a scrape sums every worker's files (the folder goes
when serve exits). One worker reports only its own, in memory. Since every request is written to its
worker's file as it is counted, a scrape counts every request any worker answered before it, and a
worker killed with SIGKILL keeps every request it answered (its file outlives it: the mapped pages are
the kernel's), where a tally flushed once a second lost the last second of the killed worker's
requests. Counting before the last bytes go, not after, is what makes that whole: a worker killed just
after an answer's last byte left has counted it (tests/test_metrics.py). The other side of that
choice: a worker killed in the microseconds between counting and its last bytes leaving has counted an
answer its client got short (that client retries, and its retry is counted too).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from datetime import UTC
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from datetime import datetime

    from prometheus_client.metrics_core import Metric
    from starlette.types import Scope

    from ..store.home import Home

ROUTES = (
    "resolve",
    "api_repo",
    "api_refs",
    "api_tree",
    "api_paths_info",
    "api_commits",
    "api_overview",
    "page",
    "metrics",
    "other",
)
METHODS = frozenset({"GET", "HEAD", "POST"})
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# Durations of resolve, stage and pull-through: a resolve from the ledger takes milliseconds, a pull of a
# large file through a slow upstream minutes.
WORK_BUCKETS = (0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 180.0, 600.0)
_API_ROUTES = {
    "refs": "api_refs",
    "revision": "api_repo",
    "tree": "api_tree",
    "paths-info": "api_paths_info",
    "commits": "api_commits",
}
_WORD = re.compile(r"[a-z][a-z0-9_]{0,31}")

_process: Metrics | None = None  # this process's serve metrics, once built; None in every other process


def route_name(raw_path: bytes) -> str:
    """The route a request path names, from ROUTES; routed as MirrorApp.dispatch does, on the raw path,
    without decoding it (only which route, not whether the repo or file exists)."""
    segs = raw_path.split(b"?", 1)[0].strip(b"/").split(b"/")
    if segs == [b""] or segs[0] == b"-":
        return "page"
    if segs == [b"metrics"]:
        return "metrics"
    if segs[0] == b"api":
        if len(segs) == 4 and segs[1] == b"organizations" and segs[3] == b"overview":
            return "api_overview"
        if len(segs) == 4 and segs[1] in (b"models", b"kernels", b"datasets", b"spaces"):
            return "api_repo"
        if len(segs) >= 5 and segs[1] in (b"models", b"kernels", b"datasets", b"spaces"):
            return _API_ROUTES.get(segs[4].decode("latin-1"), "other")
        return "other"
    if (len(segs) >= 4 and segs[2] == b"resolve") or (len(segs) >= 5 and segs[3] == b"resolve"):
        return "resolve"
    return "other"


def _word(value: str) -> str:
    """A label value from a caller: a short lower-case word, else "other" (labels must stay few)."""
    return value if _WORD.fullmatch(value) else "other"


class Metrics:
    """One serve process's metrics. `home`: what the scrape-time figures are read from (None: none)."""

    def __init__(self, home: Home | None = None) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, values

        folder = os.environ.get(MULTIPROC_ENV)
        if folder and values.ValueClass is values.MutexValue:
            # prometheus_client picks its value class once, when first imported: a process that imported it
            # before the folder was named would keep counting in memory, unseen by the other workers.
            values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]  # unannotated upstream
        self.registry = CollectorRegistry()
        # Multiprocess mode: the series live in the folder's files and a collector reads them all back;
        # registering the metric objects too would report this worker's share twice.
        reg = None if folder else self.registry
        self.requests = Counter(
            "frt_mirror_requests",
            "HTTP requests answered, by route, method and status",
            ["route", "method", "status"],
            registry=reg,
        )
        self.sent = Counter("frt_mirror_response_bytes", "Response body bytes sent, by route", ["route"], registry=reg)
        self.pull_seconds = Histogram(
            "frt_mirror_pull_seconds",
            "Pull-through fetches from upstream, by kind and outcome",
            ["kind", "outcome"],
            buckets=WORK_BUCKETS,
            registry=reg,
        )
        self.pull_bytes = Counter(
            "frt_mirror_pull_bytes", "Bytes pulled through from upstream, by kind", ["kind", "outcome"], registry=reg
        )
        self.upstream_waits = Counter(
            "frt_mirror_upstream_waits",
            "Rate-limit windows of the upstream that pull-through waited for, by bucket",
            ["bucket"],
            registry=reg,
        )
        self.upstream_wait_seconds = Counter(
            "frt_mirror_upstream_wait_seconds",
            "Seconds until those windows reset, as the upstream said when the wait began, by bucket",
            ["bucket"],
            registry=reg,
        )
        self.disk_full = Gauge(
            "frt_mirror_disk_full",
            "1 while the home's disk cannot take pulled files (passed through unkept), else 0",
            registry=reg,
            multiprocess_mode="livemax",  # any live worker that found it full says so
        )
        self.disk_full.set(0)
        if folder:
            from prometheus_client.multiprocess import MultiProcessCollector

            MultiProcessCollector(self.registry, path=folder)  # type: ignore[no-untyped-call]  # unannotated upstream
        if home is not None:
            self.registry.register(HomeCollector(home))
        # (route, method, status) -> the increments of its requests child and of its route's bytes child
        self._children: dict[tuple[str, str, int], tuple[Callable[[], None], Callable[[float], None]]] = {}
        global _process
        _process = self

    def count(self, route: str, method: str, status: int, nbytes: int) -> None:
        """One answered request, into the counters before this returns (the hot path: a dict lookup and
        one increment, two with bytes; the labelled children are looked up once per key)."""
        key = (route, method, status)
        inc = self._children.get(key)
        if inc is None:
            inc = self._children[key] = (
                self.requests.labels(route, method, str(status)).inc,
                self.sent.labels(route).inc,
            )
        inc[0]()
        if nbytes:
            inc[1](nbytes)

    def request(self, scope: Scope, status: int, nbytes: int) -> None:
        """A request the hot path did not answer: its route named from the raw path."""
        method = scope["method"]
        self.count(
            route_name(scope.get("raw_path") or scope["path"].encode()),
            method if method in METHODS else "other",
            status,
            nbytes,
        )

    def flush(self) -> None:
        """Nothing to do: every request is in the counters once counted. Kept for its callers (the app's
        shutdown, the scrape), from when a tally was flushed."""

    def exposition(self) -> bytes:
        """The text a scrape gets (reads the ledger: run it off the event loop)."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)

    # Called by the code that does the work (pull-through, in serve); thread-safe.
    def pull(self, kind: str, seconds: float, nbytes: int, outcome: str) -> None:
        kind, outcome = _word(kind), _word(outcome)
        self.pull_seconds.labels(kind, outcome).observe(seconds)
        if nbytes:
            self.pull_bytes.labels(kind, outcome).inc(nbytes)


def observe_pull(kind: str, seconds: float, nbytes: int, outcome: str) -> None:
    """One pull-through fetch from upstream, as serve's pull-through records it: `kind` what was fetched
    and `outcome` how it ended, each one short lower-case word from a small fixed set (say "refs",
    "listing", "file"; "ok", "refused", "unavailable", "error"), never a repo id or a path; `nbytes`
    the bytes fetched. Nothing happens in a process that is not serving."""
    if _process is not None:
        _process.pull(kind, seconds, nbytes, outcome)


def observe_wait(bucket: str, seconds: float) -> None:
    """Pull-through waits for the upstream's `bucket` window ("api", "resolvers"), `seconds` until it
    resets (serve/upstream_wait.py, once per window)."""
    if _process is not None:
        _process.upstream_waits.labels(_word(bucket)).inc()
        _process.upstream_wait_seconds.labels(_word(bucket)).inc(max(0.0, seconds))


def observe_disk_full(full: bool) -> None:
    """The home's disk could not take a pulled file (True), or has room again (False): serve/disk.py."""
    if _process is not None:
        _process.disk_full.set(1 if full else 0)


class HomeCollector:
    """Figures of the home, read from the ledger at each scrape: the same whichever worker answers."""

    def __init__(self, home: Home) -> None:
        self.home = home

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily
        from sqlalchemy.exc import SQLAlchemyError

        from frt.resolver.errors import FrtError

        from ..events import last_events
        from .page import store_usage

        try:  # a ledger that does not answer now costs the scrape these figures, not the scrape
            usage, staged, events = store_usage(self.home), self.home.staged(), last_events(self.home.ledger)
        except (FrtError, SQLAlchemyError, OSError):
            return
        yield GaugeMetricFamily(
            "frt_mirror_store_bytes", "Bytes of the blobs the store holds (the ledger's record)", value=usage.nbytes
        )
        yield GaugeMetricFamily("frt_mirror_store_blobs", "Blobs the store holds", value=usage.blobs)
        if usage.disk_free is not None:
            yield GaugeMetricFamily(
                "frt_mirror_disk_free_bytes", "Free bytes on the store's filesystem", value=usage.disk_free
            )
        per_target: dict[str, int] = {}
        for r in staged:
            per_target[r.target] = per_target.get(r.target, 0) + 1
        g = GaugeMetricFamily(
            "frt_mirror_staged_variants",
            'Staged sets (a repo\'s requested version or revision for a target: one variant; models: target "model")',
            labels=["target"],
        )
        for target, n in sorted(per_target.items()):
            g.add_metric([target], n)
        yield g
        at = GaugeMetricFamily(
            "frt_mirror_last_event_timestamp_seconds",
            "When the last stage, import, bundle or gc on this home finished",
            labels=["kind"],
        )
        files = GaugeMetricFamily(
            "frt_mirror_last_event_files", "Files of the last event of each kind", labels=["kind"]
        )
        nbytes = GaugeMetricFamily(
            "frt_mirror_last_event_bytes", "Bytes of the last event of each kind", labels=["kind"]
        )
        for kind, e in sorted(events.items()):
            at.add_metric([kind], _epoch(e.at))
            files.add_metric([kind], e.files)
            nbytes.add_metric([kind], e.nbytes)
        yield from (at, files, nbytes)


def _epoch(dt: datetime) -> float:

    return (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()
