"""serve's pull-through policy over frt.mirror.serve.pull_through: single flight, refs TTL, outages.

- One upstream call per thing at a time, per process: concurrent misses for one blob (or one repo's
  refresh) wait for the first one's result. Its work runs in a thread and is never cancelled by a client
  that goes away, so a slow first fetch still completes and is stored for the next request. Across
  serve's workers (and other hosts on a PostgreSQL ledger) fetch_file's per-blob lock makes the others
  find the stored blob instead of fetching it again.
- A waiter gets the result, or the fetch's own error (a cut transfer is stored as nothing: the next
  request starts a new fetch, resuming from the bytes already down when the upstream allows it).
- Refs are refreshed when older than `refs_ttl`; a refresh that fails or takes longer than `timeout`
  leaves the last known refs and everything stored in service, flagged: the response carries
  `X-Mirror-Stale` and the access log line ends in `stale`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from frt.resolver.errors import (
    FrtError,
    LedgerUnavailable,
    LocalDiskError,
    UpstreamMalformed,
    UpstreamUnavailable,
    VerificationFailed,
)

from .cache_cap import CacheBounds, NoRoom
from .catalog import ServedFile, ServedRepo
from .disk import DiskState
from .flow import Flow
from .metrics import observe_pull
from .pin import Pins
from .protocol import HubError
from .pull_through import NotAllowed, PullThrough
from .unavailable import not_askable, on_its_way, retry_after

if TYPE_CHECKING:
    from ..store.home import Home
    from .metrics import Metrics
    from .pin import Pin

STALE_HEADER = "X-Mirror-Stale"
HOLD_S = 120.0  # serve --upstream-hold's default
RETRY_FAILED_S = 1.0  # a refresh that failed is tried again this soon: a failure is never kept for the refs TTL
# Files this big (LFS ones) are streamed to the first clients while they are fetched; smaller ones are
# verified before their first byte goes out (they come down well within a client's 10 s read timeout).
STREAM_MIN = 8 << 20
# Repos the upstream does not have are remembered for the refs TTL (not asked again at once); past this
# many entries those are forgotten (asked again on their next request), those it has are kept.
MAX_UNKNOWN = 4096
T = TypeVar("T")


@dataclass(frozen=True)
class Upstream:
    """serve --upstream URL --allow ORG… --refs-ttl S --upstream-timeout S: each worker builds its own service."""

    endpoint: str
    allow: frozenset[str]
    refs_ttl: float = 60.0
    timeout: float = 5.0
    hold: float = HOLD_S
    cache: CacheBounds = CacheBounds()  # --cache-max / --min-free

    def service(self, home: Home, metrics: Metrics | None = None) -> PullService:
        from frt.resolver.attempts import RetryPolicy
        from frt.resolver.hub import HubClient
        from frt.resolver.pacing import Pacer

        from .upstream_wait import on_wait

        # A serve runs for months: no cap on the rate-limit waits of its whole life (a stager's run has one).
        pacer = Pacer(max_wait=float("inf"), on_wait=on_wait)
        hub = HubClient(self.endpoint, retry=RetryPolicy.from_env(refused=False), pacer=pacer)
        pull = PullThrough(home, hub, self.allow)
        if self.cache:
            from .cache_cap import CacheKeeper

            pull.cache = CacheKeeper(home, self.cache, metrics)
        return PullService(pull, refs_ttl=self.refs_ttl, timeout=self.timeout, hold=self.hold)


@dataclass
class _Known:
    repo: ServedRepo | None
    fresh_until: float  # monotonic time from which the upstream is asked again
    stale: str | None = None  # why the upstream could not be asked, when it could not
    unrecorded: bool = False  # held in memory only: the ledger could not record it (a full disk)
    fault: bool = False  # the upstream's answer was refused as malformed (502), not unavailable (503)


class PullService:
    """`timeout`: how long a request waits for the upstream to answer. `hold`: the longest any request
    waits for it: an API request for a repo the mirror has nothing of yet (huggingface_hub sets no
    timeout on API calls, so a client's first use rides out the upstream's rate limit), a file being
    fetched. A HEAD or GET of a repo not known yet, or of a file whose fetch waits for a rate-limit
    window, waits `timeout` only (the client's read timeout is 10 s). Past either: 503 with Retry-After."""

    def __init__(self, pull: PullThrough, *, refs_ttl: float = 60.0, timeout: float = 5.0, hold: float = HOLD_S):
        self.pull, self.refs_ttl, self.timeout, self.hold = pull, refs_ttl, timeout, hold
        self._known: dict[tuple[str, str], _Known] = {}
        self._flights: dict[Hashable, asyncio.Future[Any]] = {}  # their results: whatever each flight's work returns
        self._flows: dict[str, Flow] = {}  # blob key -> its streamed fetch in flight
        # (repo key, commit sha), or ("org", org) -> when the upstream was last asked
        self._tried: dict[tuple[tuple[str, str] | str, str], float] = {}
        self.disk = DiskState(pull.home.store)  # full or not: what passes() asks (disk.py)
        self._unvouched: set[str] = set()  # what note_unvouched could not record (the ledger unwritable)
        self.pins = Pins()  # serve --cache-max: landed fetches' pins, until their waiters have shares (pin.py)

    def allowed(self, repo_id: str) -> bool:
        return self.pull.allowed(repo_id)

    def by_wildcard(self, repo_id: str) -> bool:
        """Is the repo allowed by '*' alone (its org not named)? Then a miss is not the fleet's demand:
        the upstream was asked and has no such repo, and the name is whatever a client sent."""
        return self.allowed(repo_id) and not self.pull.named(repo_id.split("/", 1)[0])

    async def repo(
        self, repo_type: str, repo_id: str, revision: str | None = None, hold: bool = False
    ) -> tuple[ServedRepo | None, str | None]:
        """The repo as the mirror can answer it now, and why that is stale (None: fresh). The refs are
        asked for when older than the TTL (or after a failed try, within a second); a commit sha
        nobody listed yet, at most once per TTL. `hold`: the client can wait (an API call), so for a
        repo the mirror has nothing of yet it waits up to the hold budget, not the timeout: what the
        upstream is doing meanwhile (waiting out a 429 window, inside huggingface_hub's own retries or
        ours) the mirror cannot always see. A HEAD or GET that cannot wait gets 503 with Retry-After."""
        if not self.allowed(repo_id):
            return None, None
        key, now = (repo_type, repo_id), time.monotonic()
        known = self._known.get(key)
        sha = revision if revision is not None and _is_sha(revision) else None
        ask = known is None or now >= known.fresh_until
        # (not ask: known is not None; said again for the type checker)
        if (
            not ask
            and known is not None
            and sha is not None
            and (known.repo is None or known.repo.resolve(sha) is None)
        ):
            ask = now - self._tried.get((key, sha), -self.refs_ttl) >= self.refs_ttl
            if ask:
                if len(self._tried) >= 4096:
                    self._tried.clear()
                self._tried[(key, sha)] = now
        if ask:
            empty = known is None or known.repo is None
            limit = max(self.hold, self.timeout) if hold and empty else self.timeout
            if await self._wait(("refresh", key, sha), lambda: self._refresh(repo_type, repo_id, sha), limit) is None:
                return self._pending(repo_id, self._known.get(key))
        known = self._known.get(key)  # None: forgotten since it landed (MAX_UNKNOWN), so not had upstream
        return (known.repo, known.stale) if known is not None else (None, None)

    def _pending(self, repo_id: str, known: _Known | None) -> tuple[ServedRepo | None, str]:
        """The refresh is still on its way: the last known repo, flagged; with none, a 503 saying when
        to come back."""
        if known is not None and known.repo is not None:
            return known.repo, f"upstream did not answer within {self.timeout:g} s"
        raise self._on_its_way(repo_id)

    def _on_its_way(self, what: str) -> HubError:
        return on_its_way(what, self.pull.hub.pacer.blocked_for(), self.timeout)

    def come_back(self) -> str:
        """A 503's Retry-After (unavailable.py): the rate-limit window's rest, else the upstream timeout."""
        return retry_after(self.pull.hub.pacer.blocked_for(), self.timeout)

    def not_askable(self, repo_type: str, repo_id: str, stale: str) -> HubError:
        """A repo with nothing here while the upstream cannot be asked: 503, or 502 for a malformed answer."""
        known = self._known.get((repo_type, repo_id))
        return not_askable(repo_id, stale, known is not None and known.fault, self.come_back())

    async def _wait(self, key: Hashable, start: Callable[[], Awaitable[T]], limit: float) -> asyncio.Future[T] | None:
        """Wait up to `limit` seconds for the flight `key` (started if none is): the flight, landed, or
        None. A flight outlives its waiters: when it lands, what it found is what the next request sees."""
        fut = self._start(key, start)
        try:
            await asyncio.wait_for(asyncio.shield(fut), limit)
        except TimeoutError:
            return None
        return fut

    async def _refresh(self, repo_type: str, repo_id: str, revision: str | None) -> None:
        """Ask the upstream, record what it says, and keep what serve answers from now on. Runs to the
        end whoever waits for it (no thread is abandoned to carry on unseen)."""
        key, stale, outcome, t0 = (repo_type, repo_id), None, "ok", time.perf_counter()
        fault = False
        try:
            await anyio.to_thread.run_sync(self.pull.refresh, repo_type, repo_id, revision)
        except UpstreamUnavailable as e:
            stale, outcome, fault = f"upstream unavailable: {e}", "unavailable", isinstance(e, UpstreamMalformed)
        except LedgerUnavailable as e:
            stale, outcome = f"the ledger is unavailable: {e}", "ledger"
        except LocalDiskError as e:  # the upstream answered, the ledger could not keep it: held in memory
            self.disk.hit(e)
            return await self._unrecorded(repo_type, repo_id, revision, t0)
        except NotAllowed:
            self._known[key] = _Known(None, time.monotonic() + self.refs_ttl)
            return
        except FrtError:  # RepoNotFound / RevisionNotFound: the upstream's answer; what we have still stands
            outcome = "notfound"
        observe_pull("refs", time.perf_counter() - t0, 0, outcome)
        before = self._known.get(key)
        try:
            repo = await anyio.to_thread.run_sync(self.pull.served_repo, repo_type, repo_id)
        except FrtError as e:  # the ledger down: what was answered before still stands (or the catalog's)
            repo, stale = before.repo if before else None, stale or f"the ledger is unavailable: {e}"
        again = self.refs_ttl if stale is None else min(self.refs_ttl, RETRY_FAILED_S)
        if repo is None and len(self._known) >= MAX_UNKNOWN:  # under '*': a scanner's names, held in memory
            self._known = {k: v for k, v in self._known.items() if v.repo is not None}
        self._known[key] = _Known(repo, time.monotonic() + again, stale, fault=fault)

    async def _unrecorded(self, repo_type: str, repo_id: str, revision: str | None, t0: float) -> None:
        """The repo as the upstream has it now, asked again and held in memory for the refs TTL
        (unrecorded.py); its files are passed through. An upstream that fails now: as in _refresh."""
        from .unrecorded import upstream_repo

        key, outcome, stale = (repo_type, repo_id), "memory", None
        before = self._known.get(key)
        try:
            repo = await anyio.to_thread.run_sync(
                upstream_repo, self.pull.home, self.pull.hub, repo_type, repo_id, revision
            )
        except UpstreamUnavailable as e:
            repo, stale, outcome = before.repo if before else None, f"upstream unavailable: {e}", "unavailable"
        except FrtError:  # RepoNotFound / RevisionNotFound: the upstream's answer
            repo, outcome = before.repo if before else None, "notfound"
        observe_pull("refs", time.perf_counter() - t0, 0, outcome)
        again = self.refs_ttl if stale is None else min(self.refs_ttl, RETRY_FAILED_S)
        self._known[key] = _Known(repo, time.monotonic() + again, stale, unrecorded=True)

    def passes(self, repo: ServedRepo, f: ServedFile) -> bool:
        """Is `f` passed through unkept (passthrough.py) rather than fetched into the store? Where its repo
        is held in memory only, it is larger than the cache cap, or the disk cannot take it now (said once:
        disk.py). A fetch of it already
        in flight is joined."""
        known = self._known.get((repo.repo_type, repo.repo_id))
        if known is not None and known.unrecorded or (self.pull.cache and self.pull.cache.too_big(f.size)):
            return True
        if self.pull.cache is not None and self.pull.cache.bounds.min_free is not None:
            return False  # room is made by eviction first (cache_cap.py); a write that fails all the same passes
        return ("file", _key(f)) not in self._flights and not self.disk.fits(f.size)

    async def file(self, repo: ServedRepo, commit: str, f: ServedFile) -> tuple[ServedFile, Pin | None]:
        """`f` stored (fetched now, or by whoever was fetching it), and this answer's share of its pin
        under a cache cap (held until the answer has opened it); the cached repo is updated in place.
        A client waits for it at most the hold; past `timeout`, when the fetch waits for the upstream's
        rate-limit window, it gets 503 with Retry-After at once (its own read timeout is 10 s). The fetch
        goes on either way, and the next request finds the file stored."""
        key = ("file", _key(f))
        with self.waiting(_key(f)):
            fut = await self._wait(key, lambda: self._fetch(repo, commit, f), min(self.timeout, self.hold))
            if fut is None and self.pull.hub.pacer.blocked_for() <= 0 and self.hold > self.timeout:
                fut = await self._wait(key, lambda: self._fetch(repo, commit, f), self.hold - self.timeout)
            if fut is None:
                raise self._on_its_way(f"{repo.repo_id}/{f.path}")
            return fut.result(), self.share(_key(f))  # no await between its landing and the share

    def waiting(self, key: str) -> AbstractContextManager[None]:
        """An answer waits for the flight of blob `key` (pin.Pins.waiting)."""
        return self.pins.waiting(key, lambda: ("file", key) in self._flights)

    def share(self, key: str) -> Pin | None:
        """A share of the pin of blob `key`'s landed fetch (None: none held, no cache cap)."""
        return self.pins.share(key)

    def streams(self, f: ServedFile) -> bool:
        """Is `f` sent as it is fetched (serve/stream.py), rather than verified before its first byte?"""
        return f.lfs and f.size >= STREAM_MIN

    def begin(self, repo: ServedRepo, commit: str, f: ServedFile) -> Flow:
        """The fetch of `f` in flight, started now if none is: what a streaming answer reads."""
        key = _key(f)
        flow = self._flows.get(key)
        if flow is None:
            flow = self._flows[key] = Flow(self.pull.home.store.scratch.part_path(key), f.size, key, f.path)
            flow.done = self._start(("file", key), lambda: self._fetch(repo, commit, f, flow))
            flow.done.add_done_callback(lambda _: self._flows.pop(key, None))
        return flow

    async def unvouched(self, f: ServedFile) -> bool:
        return _key(f) in self._unvouched or await anyio.to_thread.run_sync(self.pull.unvouched, _key(f))

    async def note_unvouched(self, flow: Flow) -> None:
        """Recorded in the ledger; where it cannot be written (down, or a full disk), in this process's memory."""
        try:
            await anyio.to_thread.run_sync(self.pull.note_unvouched, flow.key, flow.path)
        except FrtError:
            self._unvouched.add(flow.key)

    async def _fetch(self, repo: ServedRepo, commit: str, f: ServedFile, flow: Flow | None = None) -> ServedFile:
        t0, outcome, nbytes = time.perf_counter(), "error", 0
        on_bytes = flow.wrote if flow is not None else (lambda n: None)
        self.disk.reserved += f.size  # what passes() counts as taken while this fetch runs
        try:
            stored, nbytes, pin = await anyio.to_thread.run_sync(
                self.pull.fetch, repo.repo_type, repo.repo_id, commit, f.path, on_bytes
            )
            self.pins.keep(_key(f), pin)  # let go when the flight has landed and its last waiter has its share
            outcome = "ok"
            if (c := repo.commits.get(commit)) is not None:
                c.files[f.path] = stored
            self.disk.reserved -= f.size
            self.disk.stored()
            return stored
        except VerificationFailed:
            outcome = "refused"
            raise
        except UpstreamUnavailable:
            outcome = "unavailable"
            raise
        except NoRoom:  # the cache's bounds cannot take it now: the answer passes it through
            outcome = "full"
            raise
        except LocalDiskError as e:  # its part removed at once (stage/fetch.py): the answer passes it through
            outcome = "disk"
            self.disk.hit(e, f.size)
            raise
        finally:
            if outcome != "ok":
                self.disk.reserved -= f.size
            observe_pull("file", time.perf_counter() - t0, nbytes, outcome)
            if flow is not None and flow.written and (outcome != "ok" or flow.restarts):
                await self.note_unvouched(flow)  # bytes of it may be with a client already

    async def publisher_trusted(self, org: str) -> bool | None:
        """The upstream's word on the org, asked once per TTL (kernels asks before anything else), held
        like an API request while a rate limit is waited out; else (and with the ledger down) what was
        recorded before, or None."""
        key, now = ("org", org), time.monotonic()
        if now - self._tried.get(key, -self.refs_ttl) >= self.refs_ttl:
            self._tried[key] = now
            fut = await self._wait(
                key, lambda: anyio.to_thread.run_sync(self._ask_publisher, org), max(self.hold, self.timeout)
            )
            if fut is not None:
                return fut.result()
        return await anyio.to_thread.run_sync(self._recorded_publisher, org)

    def _ask_publisher(self, org: str) -> bool | None:
        try:
            return self.pull.publisher_trusted(org, ask=True)
        except UpstreamUnavailable:
            return self._recorded_publisher(org)

    def _recorded_publisher(self, org: str) -> bool | None:
        try:
            return self.pull.publisher_trusted(org)
        except (LedgerUnavailable, LocalDiskError):  # the catalog's record was asked before this (MirrorApp.api)
            return None

    def _start(self, key: Hashable, start: Callable[[], Awaitable[T]]) -> asyncio.Future[T]:
        """The flight with this key, started if none is. The work is a task of its own: a caller that
        goes away (a client disconnect cancels its request) does not stop it."""
        fut = self._flights.get(key)
        if fut is None:
            fut = self._flights[key] = asyncio.ensure_future(start())
            fut.add_done_callback(lambda f: self._landed(key, f))
        return fut

    def _landed(self, key: Hashable, fut: asyncio.Future[Any]) -> None:
        """The flight is over: the next miss starts a new one. Its error is read here too, so one whose
        waiters all went away (clients that disconnected) is not logged as never retrieved."""
        self._flights.pop(key, None)
        if isinstance(key, tuple) and key[0] == "file":
            self.pins.landed(key[1])
        if not fut.cancelled():
            fut.exception()


def _key(f: ServedFile) -> str:
    """The blob-to-be's name (fetch.expected_key): its sha256 for an LFS file, else its git oid."""
    return f.sha256 if f.lfs else f.oid


def _is_sha(rev: str) -> bool:
    return len(rev) == 40 and all(c in "0123456789abcdef" for c in rev)
