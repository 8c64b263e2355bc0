"""The one retry loop every upstream request runs in, and what it retries.

Why our own: `huggingface_hub` (1.x and 2.x) does not retry a 503 or a refused connection on plain API
calls such as `list_repo_refs`, and a stager on a flaky link must. A 429 is not an attempt: the run's
pacer (pacing.py) read the window off the answer and holds the next try until it resets. Failures after
the last attempt become one `UpstreamUnavailable` line; a malformed answer or a redirect that would only
come again is refused at once.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeGuard, TypeVar

from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

from .errors import FrtError, UpstreamMalformed, UpstreamUnavailable, first_line
from .settings import env_number

if TYPE_CHECKING:  # checked against httpx2, the lint environment's (1.x's httpx has the same API)
    import httpx2 as _httpx
else:
    try:  # huggingface_hub 2.x speaks httpx2, 1.x httpx; both name their transport errors alike.
        import httpx2 as _httpx
    except ImportError:  # pragma: no cover - exercised in the 1.x environment
        import httpx as _httpx

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """`refused`: whether a refused (or unresolvable) connection is retried. A stager on a flaky link
    retries it; serve's pull-through does not: its client is waiting, and a refused upstream is
    unavailable now, not slow (retrying spent the whole --upstream-timeout and read as a timeout)."""

    attempts: int = 5
    base_wait: float = 0.5
    max_wait: float = 8.0
    refused: bool = True

    def sleep(self, attempt: int) -> None:
        """Exponential backoff with jitter, so stagers sharing a link do not retry in lockstep."""
        wait = min(self.max_wait, self.base_wait * 2 ** (attempt - 1))
        time.sleep(wait * (0.5 + random.random() / 2))

    @classmethod
    def from_env(cls, refused: bool = True) -> RetryPolicy:
        """FRT_RETRY_ATTEMPTS / FRT_RETRY_BASE_WAIT let tests and impatient users shorten it."""
        return cls(
            attempts=max(1, int(env_number("FRT_RETRY_ATTEMPTS", cls.attempts, int))),
            base_wait=env_number("FRT_RETRY_BASE_WAIT", cls.base_wait, float),
            refused=refused,
        )


def attempts(
    fn: Callable[[], T],
    *,
    retry: RetryPolicy,
    where: str,
    host: str,
    classify: Callable[[Exception], Exception | None] | None = None,
    prefix: str = "",
) -> T:
    """The one loop every upstream request runs in (API calls and pages here, file bodies in
    mirror.transport): `fn` is one request (its hops paced by the run's pacer, in wire.stream); a 429 is
    sent again once its window has reset (not an attempt: the pacer holds it), a transient failure
    retried with backoff up to the policy's attempts, a redirect loop or a hop off http(s) refused at
    once, and every failure one of our errors. `classify(e)` sees each failure first: the exception to
    raise instead, or None for the rules above. Our own errors pass through (the pacer's "waited too
    long" among them)."""
    attempt = 0
    while True:
        attempt += 1
        try:
            return fn()
        except FrtError:
            raise  # already one of ours: a local disk error, a body past its cap, a malformed answer
        except Exception as e:
            if classify is not None and (ours := classify(e)) is not None:
                raise ours from None
            if isinstance(e, OfflineModeIsEnabled):
                raise UpstreamUnavailable(
                    "HF_HUB_OFFLINE is set, so upstream cannot be asked; use --offline to answer from the ledger"
                ) from None
            if not isinstance(
                e, (HfHubHTTPError, _httpx.TransportError, _httpx.TooManyRedirects, ConnectionError, TimeoutError)
            ):
                if isinstance(e, _httpx.HTTPError):  # an answer broken below JSON (a bad gzip stream, header)
                    raise UpstreamMalformed(f"{where}: {first_line(e)}") from None
                raise
            if (refusal := redirect_refusal(e)) is not None:  # the same hop would come again
                raise UpstreamMalformed(f"{where}: {refusal}") from None
            if rate_limited(e):  # the pacer read its window off the answer: the next try waits for it
                attempt -= 1
                continue
            if not is_transient(e) or (not retry.refused and isinstance(e, _httpx.ConnectError)):
                raise UpstreamUnavailable(f"{prefix}upstream {host} refused: {first_line(e)}") from None
            if attempt >= retry.attempts:
                raise UpstreamUnavailable(
                    f"{prefix}upstream {host} unreachable after {attempt} attempts: {first_line(e)}"
                ) from None
            retry.sleep(attempt)


def redirect_refusal(e: BaseException) -> str | None:
    """Why a redirect is not followed, or None when `e` is no redirect's doing. A loop, or a hop off
    http(s) (file://, ftp://): both refused at once, not retried (the upstream would send them again)."""
    if isinstance(e, _httpx.TooManyRedirects):
        return "redirected more than 20 times (a redirect loop?): refused"
    if isinstance(e, _httpx.UnsupportedProtocol):
        try:
            to = str(e.request.url)
        except RuntimeError:  # no request attached
            to = "a URL"
        return f"redirected to {to!r}: only http(s) redirects are followed, refused"
    return None


def rate_limited(e: BaseException) -> TypeGuard[HfHubHTTPError]:
    return isinstance(e, HfHubHTTPError) and getattr(e.response, "status_code", None) == 429


def is_transient(e: BaseException) -> bool:
    """Worth retrying: a dropped or refused connection, a timeout, 408/429/5xx."""
    if isinstance(e, HfHubHTTPError):
        return getattr(e.response, "status_code", None) in RETRY_STATUS
    if redirect_refusal(e) is not None:
        return False
    return isinstance(e, (_httpx.TransportError, ConnectionError, TimeoutError))
