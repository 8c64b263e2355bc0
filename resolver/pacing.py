"""Pacing against the upstream's rate limits: a 429 is a wait, not a failure.

The Hub limits requests per bucket (`api`, `resolvers`) over fixed windows (5 minutes; anonymous
quotas 500 / 3,000). A 429 says when the window resets: `RateLimit: "<bucket>";r=0;t=<seconds>`, or
`Retry-After`. huggingface_hub 2.x waits that out on some calls and not on `list_repo_refs` or
`get_paths_info`; 1.x not at all; and a backoff of a few seconds would spend every retry inside one
window. So a stager paces itself: when any request meets a 429, every request to that bucket waits
until the window resets — otherwise eight download threads would burn the next window's quota in
its first millisecond. The total wait of a run is bounded (FRT_RATE_LIMIT_MAX_WAIT, default 15
minutes: a 5-minute window, twice over, and some).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Mapping

from huggingface_hub.utils import parse_ratelimit_headers

from .errors import UpstreamUnavailable
from .settings import env_number

DEFAULT_MAX_WAIT = 900.0
_FALLBACK_WAIT = 5.0  # a 429 that says nothing about when to come back


def bucket_of(url: str) -> str:
    """The Hub's bucket for a request, from its path: file resolution or the API."""
    return "resolvers" if "/resolve/" in url or "/api/resolve-cache/" in url else "api"


class Pacer:
    """`on_wait(bucket, seconds)`, if set, hears of each window a 429 makes this run wait out (once per
    window, whichever thread met it): the CLI's "waiting 43 s: the upstream's api window" line."""

    def __init__(self, max_wait: float | None = None, on_wait: Callable[[str, float], None] | None = None):
        self.on_wait = on_wait
        self.max_wait = env_number("FRT_RATE_LIMIT_MAX_WAIT", DEFAULT_MAX_WAIT) if max_wait is None else max_wait
        self._lock = threading.Lock()
        self._until: dict[str, float] = {}  # bucket -> monotonic time its window resets
        self.waited = 0.0  # seconds spent waiting on 429s in this run, all threads together
        self.limited = 0  # 429s met

    def wait(self, bucket: str) -> None:
        """Before a request: sleep while the bucket's window is known to be spent."""
        with self._lock:
            until = self._until.get(bucket, 0.0)
        if (pause := until - time.monotonic()) > 0:
            time.sleep(pause)

    def blocked_for(self) -> float:
        """Seconds until every bucket's spent window has reset (0: none is spent now)."""
        with self._lock:
            until = max(self._until.values(), default=0.0)
        return max(0.0, until - time.monotonic())

    def hold(self, headers: Mapping[str, str], bucket: str, where: str) -> None:
        """After a 429: mark the bucket spent until the upstream says, then wait for it."""
        info = parse_ratelimit_headers(headers)
        seconds = float(info.reset_in_seconds) if info is not None else _retry_after(headers)
        if info is not None:
            bucket = info.resource_type
        pause = max(0.0, seconds) + 0.2 + random.random() * 0.3  # past the boundary, not all at once
        with self._lock:
            self.limited += 1
            if self.waited + pause > self.max_wait:
                raise UpstreamUnavailable(
                    f"{where}: rate-limited by the upstream for more than {self.max_wait:.0f} s in all "
                    f"(bucket {bucket!r}); try again later, or raise FRT_RATE_LIMIT_MAX_WAIT"
                )
            self.waited += pause
            until, known = time.monotonic() + pause, self._until.get(bucket, 0.0)
            fresh = until > known + 1.0  # not a window another thread already met and announced
            self._until[bucket] = max(known, until)
        if fresh and self.on_wait is not None:
            self.on_wait(bucket, pause)
        self.wait(bucket)


def _retry_after(headers: Mapping[str, str]) -> float:
    value = next((v for k, v in headers.items() if k.lower() == "retry-after"), None)
    try:
        return float(value) if value is not None else _FALLBACK_WAIT
    except ValueError:  # an HTTP date: not worth parsing for a wait of this size
        return _FALLBACK_WAIT
