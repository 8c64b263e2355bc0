"""Pacing: the upstream's quota is a schedule, not a wall.

The Hub counts requests per bucket (`api`, `resolvers`) in fixed windows (5 minutes; anonymous quotas
500 / 3,000) and says where a run stands on *every* answer, not only on a 429:
`RateLimit: "api";r=<left>;t=<seconds to reset>`, `RateLimit-Policy: "fixed window";"api";q=<quota>;w=<window>`.
huggingface_hub 2.x waits out a 429 on some calls and not on `list_repo_refs` or `get_paths_info`; 1.x not
at all. So a run paces itself, and sends no request it knows will be refused:

- one `Pacer` per run and upstream, shared by every thread: each request is admitted through `slot(url)`,
  one account per (host, bucket), and its answer's headers are read back into the account at once;
- an account admits while the window has room (its quota `q`, less what this run sent in it, less what
  the answers show someone else spent), then holds every thread until the window resets (`t`), and the
  new window admits `q` again; before the first answer of a bucket (nothing known yet) one request goes
  alone, and a host whose answers carry no `RateLimit` is not paced;
- waiting requests go in the order their work began, and a window's last requests are kept for the
  items of `work` under way (a scan's listings), so a listing begun is finished before another begins;
- a 429 (a quota shared with someone else, or a clock that disagrees) spends the account until the reset
  it names (or `Retry-After`), at least a second; only the refused request is sent again (HubClient);
- the wait is counted in wall time, once however many threads wait on it, and bounded by
  FRT_RATE_LIMIT_MAX_WAIT (default an hour: twelve of the Hub's windows); past it the run stops with one
  line, keeping what it fetched.
`on_wait(Wait)` hears of each window the run waits for, once per window: the CLI's "waiting 7 s for the
upstream's api window" line, with the work left (`work`) and when it should end.
"""

from __future__ import annotations

import bisect
import itertools
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from urllib.parse import urlsplit

# huggingface_hub.utils re-exports these lazily, through an __all__ mypy cannot read: named where they are
# defined (the same module in 1.x and 2.x).
from huggingface_hub.utils._http import RateLimitInfo, parse_ratelimit_headers

from .errors import UpstreamUnavailable
from .settings import env_number

DEFAULT_MAX_WAIT = 3600.0
MARGIN = 0.1  # after a window's reset, before its first request: the reset we compute is never early
REFUSED_MIN = 1.0  # a 429 holds its bucket at least this long, whatever it says (r=0;t=0 again and again)
FALLBACK_WAIT = 5.0  # a 429 that says nothing about when to come back
_PROBE_WAIT = 0.5  # a thread waiting for an answer already on its way looks again this often


def bucket_of(url: str) -> tuple[str, str]:
    """The account a request is counted in: its host, and the Hub's bucket by path (file resolution or
    the API). Another host (a CDN, a package index) has accounts of its own."""
    parts = urlsplit(url)
    path = parts.path
    return parts.netloc, "resolvers" if "/resolve/" in path or path.startswith("/api/resolve-cache/") else "api"


@dataclass(frozen=True)
class Wait:
    """A window the run waits for: `seconds` until it resets; `quota` requests per `window` s where the
    upstream said; `work`: (noun, left, total) of the work this bucket carries; `eta`: seconds until
    that work should be done, from the requests it has taken so far."""

    bucket: str
    seconds: float
    quota: int | None = None
    window: float | None = None
    work: tuple[str, int, int] | None = None
    eta: float | None = None


@dataclass
class _Account:
    quota: int | None = None  # q, from RateLimit-Policy
    window: float | None = None  # w
    left: int | None = None  # requests this run may still send in the window (None: not known)
    resets: float | None = None  # when the window resets (None: not known yet)
    ended: float | None = None  # when the window before it reset: its late answers are not this one's
    out: int = 0  # requests admitted whose answers are not back
    paced: bool | None = None  # None: no answer yet; False: answers carry no RateLimit
    sent: int = 0  # requests admitted, all windows
    base: int = 0  # `sent` when this window opened: the window's own requests are those past it
    others: int = 0  # requests the upstream counted in this window that were not this run's
    announced: float = -math.inf  # the reset last announced to on_wait
    queue: list[tuple[float, int]] = field(default_factory=list)  # the waiting requests' places, in order

    def tolerance(self) -> float:
        """How far two answers' resets may differ and be the same window: `t` is whole seconds, and an
        answer's way back adds to it."""
        return 1.5 if self.window is None else min(1.5, self.window / 3)

    def roll(self, now: float) -> None:
        """The window has reset: a new one opens, with the whole quota where it is known."""
        if self.resets is not None and now >= self.resets + MARGIN:
            self.ended, self.resets = self.resets, None
            self.left, self.base, self.others = self.quota, self.sent, 0

    def admits(self, kept: int) -> bool:
        """Whether a request may go now, `kept` of the window's requests being kept for work begun before
        it (Work)."""
        if self.paced is False:
            return True
        if self.left is None:  # nothing known: one request asks; its answer tells the rest
            return not self.out
        return self.left - kept > 0


class Work:
    """Work of `total` items that spends one bucket (a scan's listings: "api"), each item a run of requests
    (a listing's pages). The pacer keeps a window's last requests for the items under way, oldest first,
    so an item begun is finished before another is begun (a scan cut short keeps whole listings, not a
    page of each); and a wait tells how many items are left and, from the requests a finished one took,
    about when they should be done."""

    def __init__(self, pacer: Pacer, bucket: str, noun: str, total: int):
        self.pacer, self.bucket, self.noun, self.total = pacer, bucket, noun, total
        self.finished = 0
        self._open: list[Item] = []
        self._spent_done = 0  # requests the finished items took

    @contextmanager
    def item(self) -> Iterator[Item]:
        """An item under way: its requests are sent with its `since` and counted on it."""
        item = Item(self, self.pacer.now())
        with self.pacer._cond:
            self._open.append(item)
            self.pacer._under_way.setdefault(self.bucket, []).append(item)
        try:
            yield item
        finally:
            with self.pacer._cond:
                self._open.remove(item)
                self.pacer._under_way[self.bucket].remove(item)
                self.finished += 1
                self._spent_done += item.sent
                self.pacer._cond.notify_all()

    def per_item(self) -> float:
        """The requests an item takes: as many as a finished one took (before any has finished: one more
        than the most an item under way has taken)."""
        if self.finished:
            return self._spent_done / self.finished
        return max((i.sent for i in self._open), default=0) + 1.0

    def needs(self) -> tuple[int, float]:
        """Items left, and the requests they should still need (at least one each)."""
        left, per_item = self.total - self.finished, self.per_item()
        begun = sum(min(i.sent, per_item - 1) for i in self._open)
        return left, max(float(left), left * per_item - begun)


@dataclass(eq=False)
class Item:
    work: Work
    since: float  # when it began: its requests' place in line
    sent: int = 0

    def request(self) -> None:
        """One more request of this item (called as it is sent)."""
        with self.work.pacer._cond:
            self.sent += 1

    def to_send(self) -> int:
        """The requests it should still send (at least its next one)."""
        return max(1, math.ceil(self.work.per_item()) - self.sent)


@dataclass
class Slot:
    """One request's place in its account: `answered(status, headers)` as soon as its headers arrive."""

    pacer: Pacer
    key: tuple[str, str]
    waited: float = 0.0  # seconds this request waited to be admitted
    _open: bool = field(default=True, repr=False)

    def answered(self, status: int, headers: Mapping[str, str]) -> None:
        if self._open:
            self._open = False
            self.pacer._answered(self, status, headers)

    def release(self) -> None:
        """No answer came (a refused connection, a timeout): the account stops waiting for one."""
        if self._open:
            self._open = False
            self.pacer._answered(self, 0, {})


class Pacer:
    def __init__(
        self,
        max_wait: float | None = None,
        on_wait: Callable[[Wait], None] | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[threading.Condition, float], object] | None = None,
    ):
        self.on_wait = on_wait
        self.max_wait = env_number("FRT_RATE_LIMIT_MAX_WAIT", DEFAULT_MAX_WAIT) if max_wait is None else max_wait
        self._clock = clock
        self._sleep = sleep or (lambda cond, seconds: cond.wait(seconds))
        self._cond = threading.Condition()
        self._accounts: dict[tuple[str, str], _Account] = {}
        self._works: list[Work] = []
        self._under_way: dict[str, list[Item]] = {}  # bucket -> the Work items under way
        self._tickets = itertools.count()
        self._waited_to = -math.inf
        self.waited = 0.0  # wall seconds this run spent held for a window (however many threads waited)
        self.limited = 0  # answers of 429

    # -- the requests' side --------------------------------------------------------------------------

    @contextmanager
    def slot(self, url: str, since: float | None = None) -> Iterator[Slot]:
        """Admit one request to `url` (waiting for its window if it is spent); the caller reports its
        answer on the slot. A request that gets none releases its place on the way out. `since`: when the
        work it is part of began (a listing's first page, on this pacer's clock): waiting requests go in
        that order, so a listing under way is finished before another is begun (and a scan cut short
        keeps whole listings, not a page of each)."""
        key = bucket_of(url)
        slot = Slot(self, key, self._admit(key, since))
        try:
            yield slot
        finally:
            slot.release()

    def blocked_for(self) -> float:
        """Seconds until every spent window has reset (0: none is spent now): a 503's Retry-After."""
        with self._cond:
            now = self._clock()
            ends = [a.resets for a in self._accounts.values() if a.resets is not None and a.left == 0]
        # none spent: 0 (not MARGIN, which read as "rate-limited for 0 s more" and a Retry-After of 1 s)
        return max(0.0, max(ends) + MARGIN - now) if ends else 0.0

    @contextmanager
    def work(self, bucket: str, noun: str, total: int) -> Iterator[Work]:
        """Work of `total` items that spends `bucket`, told of in the waits while it runs."""
        w = Work(self, bucket, noun, total)
        with self._cond:
            self._works.append(w)
        try:
            yield w
        finally:
            with self._cond:
                self._works.remove(w)

    def now(self) -> float:
        return self._clock()

    def _admit(self, key: tuple[str, str], since: float | None) -> float:
        """Admit a request (in its place in line): how long it waited."""
        with self._cond:
            account = self._accounts.setdefault(key, _Account())
            start = self._clock()
            place = (start if since is None else since, next(self._tickets))
            bisect.insort(account.queue, place)
            try:
                while True:
                    now = self._clock()
                    account.roll(now)
                    kept = sum(i.to_send() for i in self._under_way.get(key[1], ()) if i.since < place[0])
                    if account.queue[0] == place and account.admits(kept):
                        if account.left is not None:
                            account.left -= 1
                        account.out += 1
                        account.sent += 1
                        return now - start
                    if account.left is not None and account.left <= 0 and account.resets is not None:
                        until = account.resets + MARGIN
                        self._count_wait(key, account, now, until)
                        self._sleep(self._cond, until - now)
                    elif account.left is not None and account.left <= 0 and not account.out:
                        account.left = None  # spent, yet nothing out to say when it resets: ask again
                    else:  # its turn is coming, or an answer on its way will say how things stand
                        self._sleep(self._cond, _PROBE_WAIT)
            finally:
                account.queue.remove(place)
                self._cond.notify_all()  # the next in line may go

    def _count_wait(self, key: tuple[str, str], account: _Account, now: float, until: float) -> None:
        """Add this wait to the run's, in wall time (a stretch already counted is not counted again), or
        stop the run when it would pass the bound."""
        more = max(0.0, until - max(now, self._waited_to))
        if self.waited + more > self.max_wait:
            quota = f" ({account.quota} per {account.window:g} s)" if account.quota and account.window else ""
            raise UpstreamUnavailable(
                f"the upstream's {key[1]} quota{quota} would hold this run past {self.max_wait:.0f} s of waiting "
                f"in all (FRT_RATE_LIMIT_MAX_WAIT); what was fetched is kept: run it again later, or raise "
                f"FRT_RATE_LIMIT_MAX_WAIT"
            )
        self.waited += more
        self._waited_to = max(self._waited_to, until)
        if until > account.announced + account.tolerance():
            account.announced = until
            if self.on_wait is not None:
                self.on_wait(self._describe(key[1], account, until - now))

    def _describe(self, bucket: str, account: _Account, seconds: float) -> Wait:
        """The wait, with the work of the bucket under way (all of one noun together: the scans of a
        stage's repos run at once)."""
        works = [w for w in self._works if w.bucket == bucket and w.finished < w.total]
        if not works:
            return Wait(bucket, seconds, account.quota, account.window)
        noun = works[0].noun
        needs = [w.needs() for w in works if w.noun == noun]
        left, requests = sum(n for n, _ in needs), sum(r for _, r in needs)
        total = sum(w.total for w in works if w.noun == noun)
        eta = None
        if account.quota and account.window:
            eta = seconds + max(0, math.ceil(requests / account.quota) - 1) * account.window
        return Wait(bucket, seconds, account.quota, account.window, (noun, left, total), eta)

    # -- the answers' side ---------------------------------------------------------------------------

    def _answered(self, slot: Slot, status: int, headers: Mapping[str, str]) -> None:
        info = parse_ratelimit_headers(headers) if headers else None
        key = slot.key
        with self._cond:
            account = self._accounts[key]
            account.out -= 1
            now = self._clock()
            if status == 429:
                self.limited += 1
            if info is None:
                if status == 429:  # no RateLimit: Retry-After, or a guess
                    account.paced = True
                    self._spend(account, now + max(REFUSED_MIN, _retry_after(headers)))
                elif status and account.paced is None:
                    account.paced = False  # an upstream without quotas (a mirror, a package index)
            else:
                own = info.resource_type == key[1]
                if not own:  # the upstream counts it elsewhere: that account learns
                    account = self._accounts.setdefault((key[0], info.resource_type), _Account())
                self._learn(account, info, status, now, own)
            self._cond.notify_all()

    def _learn(self, account: _Account, info: RateLimitInfo, status: int, now: float, own: bool) -> None:
        """What one answer says of its window. `own`: the request was admitted in this account."""
        account.paced = True
        if info.limit is not None and info.window_seconds:
            account.quota, account.window = info.limit, float(info.window_seconds)
        resets, tol = now + info.reset_in_seconds, account.tolerance()
        if status == 429:
            self._spend(account, max(resets, now + REFUSED_MIN))
            return
        if account.resets is not None and resets < account.resets - tol:
            return  # an answer from a window that has ended since
        if account.resets is None and account.ended is not None and resets <= account.ended + tol:
            return  # the same: the window it was counted in ended on our side already
        if account.resets is None or resets > account.resets + tol:  # news of a window not known yet
            if account.resets is not None:  # the upstream's window turned before ours: what is out is its
                account.base, account.others = account.sent - account.out, 0
            account.resets = resets
        else:  # the same window: its earliest reset stands
            account.resets = min(account.resets, resets)
        if account.quota is not None and own:
            # The window's quota less what this run sent in it, less what the upstream counted that was
            # not this run's (another process behind the same address): at least its count less all this
            # run sent. Exact when nobody else spends the quota, where "r less what is out" is short by
            # what is out and already counted (and each answer's shortfall would stick).
            used = account.quota - info.remaining
            account.others = max(account.others, used - (account.sent - account.base))
            account.left = account.quota - (account.sent - account.base) - account.others
        else:  # no policy: the upstream's count, less what is out that it may not have counted yet
            left = info.remaining - account.out
            account.left = left if account.left is None else min(account.left, left)

    def _spend(self, account: _Account, until: float) -> None:
        account.left = 0
        if account.resets is None or until > account.resets + account.tolerance():
            account.resets = until
        else:
            account.resets = max(account.resets, until)


def _retry_after(headers: Mapping[str, str]) -> float:
    value = next((v for k, v in headers.items() if k.lower() == "retry-after"), None)
    try:
        return float(value) if value is not None else FALLBACK_WAIT
    except ValueError:  # an HTTP date: not worth parsing for a wait of this size
        return FALLBACK_WAIT
