"""A quota in front of a mirror (issue 48): an HTTP proxy (tests/support/hostile.py's) that forwards to
`upstream` and counts each request in the fake Hub's fixed windows (fakehub/ratelimit.py), per bucket
as the Hub buckets them (`resolvers` for a file's resolve, else `api`). Every answer carries the Hub's
`RateLimit` and `RateLimit-Policy` headers; past a window's quota it answers 429 with them and
`Retry-After`, without asking the upstream. What a site puts before its central mirror (or a central
that grew limits of its own) looks like this to the tier below.

    with QuotaProxy(central.url, RateLimits(api=10, resolvers=10, window=2)) as proxy:
        region = serving(home, "--upstream", proxy.url, ...)
        proxy.log  # every request: (bucket, its window's number, status, path)
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.support.fakehub.ratelimit import RateLimits
from tests.support.hostile import Forwarded, HostileProxy


@dataclass(frozen=True)
class Asked:
    bucket: str
    window: int  # the bucket's window it was counted in: 0, 1, 2, … in the order they opened
    status: int  # the proxy's answer: 429 when refused, else the upstream's
    path: str


@dataclass
class QuotaProxy:
    upstream: str
    limits: RateLimits
    announce: bool = True  # the Hub's headers on every answer (False: on a 429 only, as a plain limiter)
    log: list[Asked] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._windows: dict[str, tuple[int, float, int]] = {}  # bucket -> (number, start, requests counted)
        self._proxy = HostileProxy(self.upstream)
        self._proxy.rule("", self._answer)  # every request

    @property
    def url(self) -> str:
        return self._proxy.url

    def _take(self, bucket: str) -> tuple[int, list[tuple[str, str]], bool]:
        """Count one request as fakehub.RateLimiter does (a window opens at the first request after the
        last one ended): (its window's number, the Hub's headers for its answer, whether it is refused)."""
        q, w = self.limits.quota(bucket), self.limits.window
        with self._lock:
            now = time.monotonic()
            number, start, used = self._windows.get(bucket, (0, now, 0))
            if now >= start + w:
                number, start, used = number + 1, now, 0
            used += 1
            self._windows[bucket] = (number, start, used)
        reset = max(0, math.ceil(start + w - now))
        headers = [
            ("RateLimit", f'"{bucket}";r={max(q - used, 0)};t={reset}'),
            ("RateLimit-Policy", f'"fixed window";"{bucket}";q={q};w={w}'),
        ]
        return number, headers, used > q

    def _answer(self, h, fwd: Callable[[], Forwarded]) -> None:
        path = h.path.split("?", 1)[0]
        bucket = "resolvers" if "/resolve/" in path or path.startswith("/api/resolve-cache/") else "api"
        number, headers, refused = self._take(bucket)
        if refused:
            reset = headers[0][1].rsplit("t=", 1)[1]
            msg = f"You have exceeded our quota of {self.limits.quota(bucket)} requests for '{bucket}'."
            status, body = 429, msg.encode()
            out = [("Content-Type", "text/plain"), ("Retry-After", reset), ("X-Error-Message", msg), *headers]
        else:
            f = fwd()
            status, body, out = f.status, f.body, [*f.headers, *(headers if self.announce else ())]
        with self._lock:
            self.log.append(Asked(bucket, number, status, path))
        h.send(status, body, out)

    def per_window(self, bucket: str) -> dict[int, Counter[str]]:
        """{window number: Counter of "forwarded" and "refused"} for `bucket`."""
        out: dict[int, Counter[str]] = {}
        with self._lock:
            for a in self.log:
                if a.bucket == bucket:
                    out.setdefault(a.window, Counter())["refused" if a.status == 429 else "forwarded"] += 1
        return out

    def close(self) -> None:
        self._proxy.close()

    def __enter__(self) -> QuotaProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
