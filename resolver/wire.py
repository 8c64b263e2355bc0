"""Bounded reads from the upstream: every answer against a byte cap and an overall deadline, every
listing against a page and an entry cap, and an answer that is not JSON one line naming the route.

Why not huggingface_hub's HfApi for the JSON routes: it reads every answer whole (`r.json()`, also a
500's body, to quote it in the error) and follows `Link: rel=next` for as long as the upstream sends one.
Against a broken or hostile upstream that is unbounded memory (a body that never ends), unbounded time
(pages without end; a body trickling a byte at a time, each read well inside httpx's read timeout, which
is per read, not per request) and tracebacks from inside the library (JSON that is not, or is nested 100k
deep). So the mirror reads the Hub's JSON routes itself, through huggingface_hub's own session (its
headers, token, offline mode and proxies stay as they are), and `gate` checks the shapes.

The limits, from the environment (README, "Notes for operators"):
  FRT_MAX_API_BYTES        64 MiB   one API answer (one page of a listing)
  FRT_MAX_METADATA_BYTES   16 MiB   one metadata.json (and never more than its listed size)
  FRT_MAX_PAGES            10,000   pages of one listing (a tree, a history)
  FRT_MAX_LISTING_ENTRIES  20,000   entries of one listing, all its pages together (they become ledger
                                    rows in one write: 20k rows take ~10 s on a slow disk, inside the
                                    ledger's 30 s busy timeout; 100k took ~40 s and locked out others)
  FRT_UPSTREAM_DEADLINE_S  300      one API call (a listing: every page and redirect of it), not counting
                                    the time it waits for a rate-limit window; a file body gets this
                                    plus its size at FRT_UPSTREAM_MIN_RATE bytes/s (default 64 KiB/s)
An error answer's body is read up to 64 KiB (enough for its message). Redirects: httpx's 20 at most,
http(s) only (attempts.redirect_refusal). The deadline is checked as each piece of a body arrives, so a
trickle ends within one read timeout of it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import urljoin, urlsplit

from huggingface_hub import get_session, hf_raise_for_status

from .errors import UpstreamMalformed
from .gate import json_kind
from .settings import env_number

if TYPE_CHECKING:  # checked against httpx2, the lint environment's (1.x's httpx has the same API)
    import httpx2 as _httpx

    from .pacing import Pacer
else:
    try:  # huggingface_hub 2.x speaks httpx2, 1.x httpx
        import httpx2 as _httpx
    except ImportError:  # pragma: no cover - exercised in the 1.x environment
        import httpx as _httpx

ERROR_BODY_CAP = 64 << 10
MAX_REDIRECTS = 20  # httpx's own
CONNECT_S, READ_S = 30.0, 120.0  # httpx's per-phase timeouts; the deadline bounds the whole
_REBUILT = {"content-encoding", "content-length", "transfer-encoding"}  # describe bytes we no longer hold
Params = Mapping[str, str | int | float | bool | None]  # a request's query, as httpx takes one


@dataclass(frozen=True)
class Limits:
    api_bytes: int = 64 << 20
    metadata_bytes: int = 16 << 20
    pages: int = 10_000
    entries: int = 20_000
    deadline_s: float = 300.0
    min_rate: float = 64 << 10  # bytes/s a file body is given on top of the deadline

    @classmethod
    def from_env(cls) -> Limits:
        return cls(
            api_bytes=env_number("FRT_MAX_API_BYTES", cls.api_bytes, int),
            metadata_bytes=env_number("FRT_MAX_METADATA_BYTES", cls.metadata_bytes, int),
            pages=env_number("FRT_MAX_PAGES", cls.pages, int),
            entries=env_number("FRT_MAX_LISTING_ENTRIES", cls.entries, int),
            deadline_s=env_number("FRT_UPSTREAM_DEADLINE_S", cls.deadline_s, float),
            min_rate=max(1.0, env_number("FRT_UPSTREAM_MIN_RATE", cls.min_rate, float)),
        )

    def deadline(self, size: int = 0) -> Deadline:
        """The deadline of one call starting now; `size`: the bytes of a file body it carries."""
        return Deadline(self.deadline_s + size / self.min_rate)


class DeadlinePassed(TimeoutError):
    """The answer did not complete within its deadline: a timeout, retried as any other."""


class Deadline:
    def __init__(self, seconds: float):
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def extend(self, seconds: float) -> None:
        """Time spent waiting for the upstream's rate-limit window is not the answer's."""
        self.seconds += seconds
        self.end += seconds

    def check(self, what: str) -> None:
        if self.left() <= 0:
            raise DeadlinePassed(
                f"{what}: no complete answer within the {self.seconds:g} s deadline (FRT_UPSTREAM_DEADLINE_S)"
            )

    def timeout(self) -> _httpx.Timeout:
        """httpx's timeouts for a request under this deadline: no phase may wait past it."""
        left = max(0.05, self.left())
        return _httpx.Timeout(min(READ_S, left), connect=min(CONNECT_S, left))


class TooLarge(UpstreamMalformed):
    """An answer longer than its cap (or than the size the listing gave it)."""


class Got(NamedTuple):
    body: bytes
    next_url: str | None  # the answer's `Link: <…>; rel="next"`, absolute


def read_body(
    r: _httpx.Response, cap: int, deadline: Deadline, what: str, limit_name: str = "FRT_MAX_API_BYTES"
) -> bytes:
    """`r`'s body, at most `cap` bytes, before the deadline; more is TooLarge, and reading stops there."""
    declared = r.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > cap:
        raise TooLarge(f"{what}: the answer says {int(declared)} bytes, over the {cap}-byte limit ({limit_name})")
    buf = bytearray()
    for chunk in r.iter_bytes():  # each piece as it arrives (a chunk size would wait to fill it)
        buf += chunk
        if len(buf) > cap:
            raise TooLarge(f"{what}: the answer runs past the {cap}-byte limit ({limit_name}); stopped there")
        deadline.check(what)
    return bytes(buf)


def raise_for_status(r: _httpx.Response, deadline: Deadline) -> None:
    """huggingface_hub's own error for an error answer (RepositoryNotFoundError, …, HfHubHTTPError), from
    at most 64 KiB of its body: a 500 whose body never ends is one error, not all the memory there is.
    (hf_raise_for_status would read a streamed body whole.)"""
    if r.status_code < 400:
        return
    buf = bytearray()
    try:
        for chunk in r.iter_bytes():
            buf += chunk
            if len(buf) >= ERROR_BODY_CAP or deadline.left() <= 0:
                break
    except _httpx.HTTPError:
        pass  # what came is enough to say what the error was
    headers = [(k, v) for k, v in r.headers.multi_items() if k.lower() not in _REBUILT]
    for body in (bytes(buf[:ERROR_BODY_CAP]), b""):
        copy = _httpx.Response(r.status_code, headers=headers, content=body, request=r.request)
        try:
            hf_raise_for_status(copy)
        except (ValueError, TypeError, AttributeError, KeyError, RecursionError):
            continue  # its parser of the message choked on the body (a JSON list, 100k deep): status alone
    raise UpstreamMalformed(f"{r.request.url.path}: answered {r.status_code}")  # pragma: no cover


@contextmanager
def stream(
    url: str,
    *,
    headers: Mapping[str, str],
    deadline: Deadline,
    pacer: Pacer | None,
    params: Params | None = None,
    since: float | None = None,
) -> Iterator[_httpx.Response]:
    """GET `url` through huggingface_hub's session, its redirects followed one hop at a time: each hop is
    admitted by `pacer` (a 307 to the resolve cache is a request of the upstream's quota too) and its
    answer's headers shown to it at once. The time a hop waits for its window is added to the deadline.
    httpx's rules for the hops stay (its `next_request`: Authorization dropped on another host); at most
    20 of them, http(s) only (attempts.redirect_refusal names both). Yields the last answer, its body unread.
    `since`: when the work this request is part of began (Pacer.slot)."""
    deadline.check(url)
    session = get_session()
    request = session.build_request("GET", url, params=params, headers=headers)
    for _ in range(MAX_REDIRECTS + 1):
        with pacer.slot(str(request.url), since) if pacer is not None else nullcontext() as slot:
            if slot is not None:
                deadline.extend(slot.waited)
            request.extensions["timeout"] = deadline.timeout().as_dict()
            r = session.send(request, stream=True, follow_redirects=False)
            if slot is not None:
                slot.answered(r.status_code, r.headers)
        if not r.has_redirect_location:
            try:
                yield r
            finally:
                r.close()
            return
        nxt = r.next_request
        _drain(r)
        if nxt is None:  # httpx could not make a request of its Location
            raise _httpx.RemoteProtocolError("Invalid URL in location header", request=request)
        request = nxt
    raise _httpx.TooManyRedirects("Exceeded maximum allowed redirects.", request=request)


def _drain(r: _httpx.Response) -> None:
    """A redirect's body, read (a little: the connection goes back to the pool) and closed."""
    try:
        got = 0
        for chunk in r.iter_bytes():
            got += len(chunk)
            if got >= ERROR_BODY_CAP:
                break
    except _httpx.HTTPError:
        pass
    finally:
        r.close()


def get(
    url: str,
    *,
    headers: Mapping[str, str],
    deadline: Deadline,
    cap: int,
    what: str,
    params: Params | None = None,
    limit_name: str = "FRT_MAX_API_BYTES",
    pacer: Pacer | None = None,
    since: float | None = None,
) -> Got:
    """GET `url` (`stream`), its body read to at most `cap` bytes before `deadline`; an error answer
    raised as huggingface_hub raises it."""
    deadline.check(what)
    with stream(url, headers=headers, deadline=deadline, pacer=pacer, params=params, since=since) as r:
        raise_for_status(r, deadline)
        nxt = r.links.get("next", {}).get("url")
        body = read_body(r, cap, deadline, what, limit_name)
        return Got(body, urljoin(str(r.url), nxt) if nxt else None)


def parse_json(body: bytes, what: str) -> object:
    """The answer as JSON, or one line saying it is not."""
    try:
        return json.loads(body)
    except RecursionError:
        raise UpstreamMalformed(f"{what}: the answer is JSON nested too deep to read") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise UpstreamMalformed(f"{what}: the answer is not JSON ({e}; it starts {body[:40]!r})") from None


def get_json(
    url: str,
    *,
    headers: Mapping[str, str],
    limits: Limits,
    what: str,
    params: Params | None = None,
    pacer: Pacer | None = None,
) -> object:
    got = get(
        url, headers=headers, deadline=limits.deadline(), cap=limits.api_bytes, what=what, params=params, pacer=pacer
    )
    return parse_json(got.body, what)


def pages(
    url: str,
    fetch: Callable[[str, Params | None], Got],
    *,
    limits: Limits,
    what: str,
    params: Params | None = None,
) -> Iterator[list[Any]]:
    """Each page of a listing (a JSON list), following `Link: rel="next"`; past `limits.pages` pages or
    `limits.entries` entries it stops with one line. `fetch(url, params)` gets one page: the unit the
    caller retries and paces (a page refused by a rate limit is asked again, not the listing)."""
    n, entries = 0, 0
    at: str | None = url  # this page's URL; None past the last
    while at is not None:
        n += 1
        if n > limits.pages:
            raise UpstreamMalformed(f"{what}: the listing runs past {limits.pages} pages (FRT_MAX_PAGES); stopped")
        if urlsplit(at).scheme not in ("http", "https"):
            raise UpstreamMalformed(f"{what}: page {n} is at {at!r}, not an http(s) URL")
        got = fetch(at, params if n == 1 else None)  # a next URL carries its own query
        page, at = parse_json(got.body, what), got.next_url
        if not isinstance(page, list):
            raise UpstreamMalformed(f"{what}: page {n} is {json_kind(page)}, not a list")
        entries += len(page)
        if entries > limits.entries:
            raise UpstreamMalformed(
                f"{what}: the listing runs past {limits.entries} entries (FRT_MAX_LISTING_ENTRIES); stopped"
            )
        yield page
