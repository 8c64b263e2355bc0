"""The pacer alone (resolver/pacing.py), against the fake Hub's own rate limiter (fixed windows, RateLimit on
every answer, 429 past the quota) in-process: a fake clock where one thread is enough to judge the
arithmetic, real threads and short windows where concurrency is what is judged. Issue 43."""

from __future__ import annotations

import math
import threading
import time

import pytest

from frt.resolver.errors import UpstreamUnavailable
from frt.resolver.pacing import MARGIN, Pacer, Wait
from tests.support.fakehub.ratelimit import RateLimiter, RateLimits
from tests.support.fakehub.wire import HubError

API = "http://hub.test/api/kernels/org/k/tree/abc/build"
FILE = "http://hub.test/kernels/org/k/resolve/abc/build/x/metadata.json"


class Clock:
    """Time that passes only when a waiter sleeps (one thread)."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, _cond, seconds: float) -> None:
        self.t += max(seconds, 0.001)


def ask(pacer: Pacer, limiter: RateLimiter, url: str = API, bucket: str = "api") -> int:
    """One request through the pacer to the limiter; its status."""
    with pacer.slot(url) as slot:
        try:
            headers = limiter.take(bucket)
        except HubError as e:
            slot.answered(429, {k: str(v) for k, v in e.headers.items()})
            return 429
        slot.answered(200, headers)
        return 200


def test_a_run_of_one_thread_fills_each_window_and_never_meets_a_429():
    clock = Clock()
    limiter = RateLimiter(RateLimits(api=8, resolvers=3000, window=10), clock=clock)
    waits: list[Wait] = []
    pacer = Pacer(max_wait=1e9, on_wait=waits.append, clock=clock, sleep=clock.sleep)
    start = clock()
    statuses = [ask(pacer, limiter) for _ in range(30)]
    assert statuses == [200] * 30
    windows = math.ceil(30 / 8)
    assert len(waits) == windows - 1 and all(w.quota == 8 and w.window == 10 for w in waits)
    # each wait ends just past the reset the upstream named, never before it (ceil'd to whole seconds)
    assert (windows - 1) * 10 <= clock() - start <= (windows - 1) * (10 + 1 + MARGIN) + 0.1
    assert pacer.waited == pytest.approx(clock() - start, abs=0.1), "the wait is the run's wall time"


def test_the_first_request_of_a_bucket_goes_alone_then_the_window_says_how_many_follow():
    limiter = RateLimiter(RateLimits(api=3, resolvers=3000, window=60))
    pacer = Pacer(max_wait=0)  # any wait at all would raise
    first = pacer.slot(API)
    slot = first.__enter__()
    second: list[int] = []
    t = threading.Thread(target=lambda: second.append(ask(pacer, limiter)))
    t.start()
    time.sleep(0.3)
    assert second == [], "nothing is known of the window yet: the second request waits for the first's answer"
    slot.answered(200, limiter.take("api"))  # r=2
    first.__exit__(None, None, None)
    t.join(5)
    assert second == [200]
    assert ask(pacer, limiter) == 200  # r=0 now
    with pytest.raises(UpstreamUnavailable, match="FRT_RATE_LIMIT_MAX_WAIT"):
        ask(pacer, limiter)  # known spent: not sent, and waiting is over the bound


def test_a_host_whose_answers_carry_no_ratelimit_is_not_paced():
    pacer = Pacer(max_wait=0)
    with pacer.slot("http://index.test/simple/einops/") as slot:
        slot.answered(200, {"Content-Type": "text/html"})
    slots = [pacer.slot("http://index.test/simple/x/") for _ in range(20)]
    for s in slots:
        s.__enter__()  # twenty at once: none waits (max_wait=0 would raise)
    for s in slots:
        s.__exit__(None, None, None)


def test_buckets_and_hosts_are_accounts_of_their_own():
    clock = Clock()
    limiter = RateLimiter(RateLimits(api=2, resolvers=5, window=10), clock=clock)
    pacer = Pacer(max_wait=1e9, clock=clock, sleep=clock.sleep)
    for _ in range(2):
        assert ask(pacer, limiter) == 200
    for _ in range(5):  # the api window is spent; the resolvers one is not: no wait
        assert ask(pacer, limiter, FILE, "resolvers") == 200
    assert clock.t == 1000.0
    index = RateLimiter(RateLimits(api=1, resolvers=1, window=10), clock=clock)  # another host's quota
    assert ask(pacer, index, "http://index.test/simple/x/") == 200
    assert clock.t == 1000.0, "a package index's window does not spend the Hub's, nor the other way"


def test_a_429_with_retry_after_alone_holds_the_bucket_that_long_and_at_least_a_second():
    clock = Clock()
    pacer = Pacer(max_wait=1e9, clock=clock, sleep=clock.sleep)
    with pacer.slot(API) as s:
        s.answered(429, {"Retry-After": "7"})
    with pacer.slot(API) as s:
        s.answered(200, {})
    assert 1007 <= clock.t <= 1007 + MARGIN + 0.01
    with pacer.slot(API) as s:
        s.answered(429, {"RateLimit": '"api";r=0;t=0'})  # "now": still a second, not a loop
    t0 = clock.t
    with pacer.slot(API) as s:
        s.answered(200, {})
    assert clock.t - t0 >= 1.0
    assert pacer.limited == 2


def test_an_answer_from_a_window_that_ended_does_not_spend_the_next():
    clock = Clock()
    pacer = Pacer(max_wait=1e9, clock=clock, sleep=clock.sleep)
    policy = '"fixed window";"api";q=4;w=10'

    def one(r: int, t: int = 10) -> None:
        with pacer.slot(API) as s:
            s.answered(200, {"RateLimit": f'"api";r={r};t={t}', "RateLimit-Policy": policy})

    one(3)
    late = pacer.slot(API)
    late_slot = late.__enter__()  # sent in the first window; its answer comes after that window ended
    one(0)  # the upstream counted the late one and another's: this window is spent
    t0 = clock.t
    one(3)  # waits for the reset; a new window
    assert clock.t - t0 >= 10
    late_slot.answered(200, {"RateLimit": '"api";r=0;t=0', "RateLimit-Policy": policy})
    late.__exit__(None, None, None)
    t1 = clock.t
    one(2)
    assert clock.t == t1, "the late r=0 was the old window's word"


def test_the_bound_on_waiting_counts_wall_time_and_stops_before_a_wait_past_it():
    clock = Clock()
    limiter = RateLimiter(RateLimits(api=1, resolvers=3000, window=10), clock=clock)
    pacer = Pacer(max_wait=25, clock=clock, sleep=clock.sleep)
    for _ in range(3):  # two waits of ~11 s: 22 s
        assert ask(pacer, limiter) == 200
    t = clock.t
    with pytest.raises(UpstreamUnavailable) as e:
        ask(pacer, limiter)
    assert clock.t == t, "it did not wait for a window it would not be allowed to use"
    assert "api quota (1 per 10 s)" in str(e.value) and "25 s" in str(e.value)


def test_threads_share_one_account_wait_once_per_window_and_meet_no_429():
    """Sixteen threads, 8 requests a second: every window filled, none overrun; the wait is counted once,
    not once per thread (a window's second, not 16 s), and announced once per window."""
    limits = RateLimits(api=8, resolvers=3000, window=1)
    limiter = RateLimiter(limits)
    waits: list[Wait] = []
    pacer = Pacer(max_wait=60, on_wait=waits.append)
    statuses: list[int] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(3):
            s = ask(pacer, limiter)
            with lock:
                statuses.append(s)

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    wall = time.monotonic() - t0
    windows = math.ceil(48 / limits.api)
    assert statuses.count(200) == 48 and statuses.count(429) == 0, statuses
    assert pacer.waited <= wall + 0.01
    assert windows - 1 <= len(waits) <= windows, len(waits)
    assert wall >= (windows - 1) * limits.window


def test_waiting_requests_go_in_the_order_their_work_began():
    """A listing under way is served before one begun later (Pacer.slot `since`)."""
    clock = Clock()
    pacer = Pacer(max_wait=1e9, clock=clock)
    order: list[str] = []
    gate = threading.Event()
    with pacer.slot(API) as s:  # the probe: nothing is admitted until it is answered
        threads = []
        for name, since in (("late", 2.0), ("early", 1.0), ("middle", 1.5)):

            def go(name=name, since=since):
                with pacer.slot(API, since) as slot:
                    order.append(name)
                    slot.answered(200, {})
                    gate.wait(5)

            threads.append(threading.Thread(target=go))
        for t in threads:
            t.start()
        time.sleep(0.3)
        s.answered(200, {})  # no RateLimit: the host is not paced; the queue drains in order
    gate.set()
    for t in threads:
        t.join(5)
    assert order == ["early", "middle", "late"]


def test_a_windows_last_requests_are_kept_for_the_listing_under_way():
    """Work (a scan's listings): once a finished listing has said how many pages one takes, a new listing's
    first page does not take the window's last request while a listing begun before it still needs it,
    so a scan cut short keeps whole listings. The arithmetic, on a fake clock: with real threads (the CLI
    test) how many listings a first window begins depends on how fast each thread asks its next page."""
    clock = Clock()
    limiter = RateLimiter(RateLimits(api=8, resolvers=1000, window=10), clock=clock)
    pacer = Pacer(max_wait=1e9, clock=clock, sleep=clock.sleep)

    def page(item) -> None:  # as HubClient asks a listing's page: counted on its item, in its place in line
        item.request()
        with pacer.slot(API, item.since) as slot:
            slot.answered(200, limiter.take("api"))

    with pacer.work("api", "listings", 3) as work:
        with work.item() as first:
            for _ in range(4):
                page(first)  # 4 of the window's 8: a listing is 4 pages
        with work.item() as under_way:
            for _ in range(3):
                page(under_way)  # 7 of 8: one request left, and it needs one more page
            clock.t += 0.5  # the next listing is begun after this one
            opened = clock()
            with work.item() as later:
                page(later)  # waits for the next window rather than take the one under way needs
                assert clock() >= opened + 10 - 1 + MARGIN
            page(under_way)
