"""The Hub's rate limits: fixed windows per bucket, announced on every answer of the bucket.

The real Hub (hub-docs `rate-limits.md`) counts requests per bucket in fixed 5-minute windows
(anonymous: "api" 500, "resolvers" 3,000) and sends, on every answer of a bucket,
`RateLimit: "api";r=<left>;t=<seconds to reset>` and
`RateLimit-Policy: "fixed window";"api";q=<quota>;w=<window>`. Over quota it answers 429 with the same
headers. huggingface_hub (2.x, and 1.x for some calls) reads `t` off a 429 with `r=0` and waits `t + 1`
seconds before retrying; which calls retry at all differs by version, and that is what a stager
behind a rate-limited Hub must cope with.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass

from .wire import HubError


@dataclass(frozen=True)
class RateLimits:
    """Quotas per window. Defaults are the real Hub's anonymous ones; tests use tiny numbers."""

    api: int = 500
    resolvers: int = 3000
    window: int = 300  # seconds

    def quota(self, bucket: str) -> int:
        return {"api": self.api, "resolvers": self.resolvers}[bucket]


class RateLimiter:
    """Counts answers per bucket. A window opens at the first request after the previous one ended
    (fixed, not sliding: a burst at the end of one window and the start of the next both pass)."""

    def __init__(self, limits: RateLimits, clock=time.monotonic):
        self.limits = limits
        self._clock = clock
        self._lock = threading.Lock()
        self._windows: dict[str, tuple[float, int]] = {}  # bucket -> (window start, requests counted)

    def take(self, bucket: str) -> dict:
        """Count one request; return the headers for its answer, or raise the 429."""
        q, w = self.limits.quota(bucket), self.limits.window
        with self._lock:
            now = self._clock()
            start, used = self._windows.get(bucket, (now, 0))
            if now >= start + w:
                start, used = now, 0
            used += 1
            self._windows[bucket] = (start, used)
        reset = max(0, math.ceil(start + w - now))
        headers = {
            "RateLimit": f'"{bucket}";r={max(q - used, 0)};t={reset}',
            "RateLimit-Policy": f'"fixed window";"{bucket}";q={q};w={w}',
        }
        if used > q:
            msg = f"You have exceeded our quota of {q} requests per {w} s for '{bucket}'. Retry after {reset} seconds."
            raise HubError(429, None, msg, {"Retry-After": reset, "X-Error-Message": msg, **headers})
        return headers
