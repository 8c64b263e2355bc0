"""Wire details of the Hub protocol shared by the server: errors, raw paths, ranges."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

if TYPE_CHECKING:
    from datetime import datetime

    from starlette.types import Message, Receive, Scope

MAX_PATH = 4096
# A POST body (paths-info: a list of paths; huggingface_hub sends all it asks for in one): 4 MiB holds
# ~40k paths, more than a kernel repo has files. Read up to this, never whole whatever its size.
MAX_BODY = 4 << 20
CLOSE = (b"connection", b"close")
_PCT = re.compile(rb"%([0-9A-Fa-f]{2})")
# A header value is printable ASCII here: the message may quote the request's path, and a decoded
# control character (%0A, %1F) in a header makes uvicorn refuse the whole response (a 500).
_UNSAFE_IN_HEADER = re.compile(r"[^\x20-\x7e]")


class HubError(Exception):
    """An error answer. `code` becomes X-Error-Code, which is what huggingface_hub maps to
    RepositoryNotFoundError / RevisionNotFoundError / EntryNotFoundError (not the status)."""

    def __init__(self, status: int, code: str | None, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}

    def response(self, head: bool = False) -> JSONResponse:
        headers = dict(self.headers)
        headers["X-Error-Message"] = _UNSAFE_IN_HEADER.sub("?", self.message)
        if self.code:
            headers["X-Error-Code"] = self.code
        resp = JSONResponse({"error": self.message}, status_code=self.status, headers=headers)
        if head:  # a HEAD answer has the headers, not the body
            resp.body = b""
        return resp


async def read_body(request: Request, cap: int = MAX_BODY) -> bytes:
    """The request's body, or a 413 as soon as it (or its Content-Length) passes `cap`."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap:
        raise HubError(413, None, f"request body over {cap} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > cap:
            raise HubError(413, None, f"request body over {cap} bytes")
    return bytes(body)


def declares_body(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """Do a request's (raw) headers say a body follows (a Content-Length other than 0, or chunked)?"""
    return any(
        (name == b"content-length" and value.strip() != b"0") or name == b"transfer-encoding" for name, value in headers
    )


class HasHeaders(Protocol):
    """An answer whose raw headers can still be added to (Starlette's responses, objects.ObjectResponse)."""

    raw_headers: list[tuple[bytes, bytes]]


class BodyRequest(Request):
    """A request that notes whether its body, where it declares one, was read to its end. One that was
    not (a route that takes none, a 413 part-way) is answered with `Connection: close` (`settle`), so
    uvicorn closes the connection after the answer instead of reading on, and dropping, whatever the
    client still sends: without it an endless body held a connection as long as its client liked."""

    def __init__(self, scope: Scope, receive: Receive) -> None:
        self.ended = not declares_body(scope["headers"])
        super().__init__(scope, self._noted(receive) if not self.ended else receive)

    def _noted(self, receive: Receive) -> Receive:
        async def noted() -> Message:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                self.ended = True
            return message

        return noted

    def settle(self, response: HasHeaders) -> None:
        if not self.ended:
            response.raw_headers = [*response.raw_headers, CLOSE]


def split_raw_path(raw: bytes) -> list[str]:
    """Split the raw request path on "/", then percent-decode each segment strictly.

    Malformed escapes, non-UTF-8, NUL, and "." / ".." segments are a 400; an overlong path a 414.
    """
    if len(raw) > MAX_PATH:
        raise HubError(414, None, "Request path too long")
    raw = raw.split(b"?", 1)[0].strip(b"/")
    if b"%" not in raw and b"\x00" not in raw:  # the common case (every HEAD): one decode, one split
        try:
            out = raw.decode("utf-8").split("/") if raw else []
        except UnicodeDecodeError:
            raise HubError(400, None, "Path is not UTF-8") from None
        if "" in out or "." in out or ".." in out:
            raise HubError(400, None, "Invalid path segment")
        return out
    out = []
    for seg in raw.split(b"/"):
        if b"%" in seg and len(_PCT.findall(seg)) != seg.count(b"%"):
            raise HubError(400, None, "Malformed percent-encoding in path")
        try:
            text = _PCT.sub(lambda m: bytes([int(m[1], 16)]), seg).decode("utf-8")
        except UnicodeDecodeError:
            raise HubError(400, None, "Path is not UTF-8") from None
        if "\x00" in text or text in (".", "..") or not text:
            raise HubError(400, None, "Invalid path segment")
        out.append(text)
    return out


# `refs/<kind>/<name>` arrives raw (three segments) as well as encoded (one, `refs%2Fheads%2Fv1`).
REF_KINDS = ("heads", "tags", "pr", "convert")


def split_revision(segs: list[str]) -> tuple[str, list[str]]:
    """The revision at the head of `segs` (split, decoded path segments) and the segments after it.

    Clients encode a revision as one segment (`refs%2Fheads%2Fv1`, `release%2Fv1`); the Hub also takes
    a raw `refs/heads/v1` or `refs/pr/1`, so a leading `refs/<kind>/` takes the next segment with it.
    A slash in the name itself must then be encoded (`refs/heads/release%2Fv1`), as clients do."""
    if len(segs) >= 3 and segs[0] == "refs" and segs[1] in REF_KINDS:
        return "/".join(segs[:3]), segs[3:]
    return segs[0], segs[1:]


def parse_range(header: str | None, size: int) -> tuple[int, int] | Literal["unsatisfiable"] | None:
    """`bytes=s-e`, `bytes=s-` or `bytes=-n` → (start, end_exclusive); None: serve it all;
    "unsatisfiable" → 416. A multi-range request is answered with the whole file, as RFC 9110 allows."""
    if not header:
        return None
    # ASCII only (\d would take "٣"), and numbers past 18 digits read as "beyond any file": int() of
    # a 5,000-digit string raises (Python's int max str digits), which was a 500.
    m = re.fullmatch(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*", header, re.ASCII)
    if not m or (not m[1] and not m[2]):
        return None
    first, last = (_num(g) if g else None for g in (m[1], m[2]))
    if first is None:
        assert last is not None  # m[1] is empty, so m[2] is not (checked above)
        if last == 0:
            return "unsatisfiable"
        return (max(0, size - last), size)
    end = min(last + 1, size) if last is not None else size
    if first >= size or (last is not None and last < first):
        return "unsatisfiable"
    return (first, end)


def _num(digits: str) -> int:
    return int(digits) if len(digits.lstrip("0")) <= 18 else 1 << 62


def paginate(request: Request, items: Sequence[object], size: int) -> Response:
    """`Link: <absolute url>; rel="next"`, as the Hub pages (huggingface_hub follows it verbatim)."""
    try:
        start = max(0, int(request.query_params.get("cursor", "0")))
    except ValueError:
        raise HubError(400, None, "Bad cursor") from None
    page = items[start : start + size]
    headers = {}
    if start + size < len(items):
        url = request.url.include_query_params(cursor=start + size)
        headers["Link"] = f'<{url}>; rel="next"'
    return JSONResponse(page, headers=headers)


def iso_time(dt: datetime | None) -> str:
    return dt.strftime("%Y-%m-%dT%H:%M:%S.000Z") if dt else "1970-01-01T00:00:00.000Z"


TOKEN_HINT = "clients set HF_TOKEN to a token from 'frt-mirror token add NAME' (run where this mirror's home is)"
TOKEN_MESSAGE = f"Invalid or missing token for this mirror: {TOKEN_HINT}"


def public_route(scope: Scope) -> bool:
    """What serve answers without a token: an org's overview, public on the Hub too. kernels asks it
    before anything else, and a 401 there reads as "could not verify publisher trust status. Set
    trust_remote_code=True", advice that turns the trust check off instead of naming the token; so the
    first refusal a tokenless client meets is its revision's, with the token's own message."""
    if scope["method"] not in ("GET", "HEAD"):
        return False
    try:
        segs = split_raw_path(scope.get("raw_path") or scope["path"].encode())
    except HubError:  # a malformed path is not the overview: without a token, 401 as for any other
        return False
    return len(segs) == 4 and segs[:2] == ["api", "organizations"] and segs[3] == "overview"


async def read_paths_info(request: Request) -> tuple[list[object], bool]:
    """The body of `POST …/paths-info/{rev}`: its paths and expand, as JSON or as the form
    huggingface_hub sends (`paths=a&paths=b&expand=true`)."""
    body = await read_body(request, MAX_BODY)
    if request.headers.get("content-type", "").startswith("application/json"):
        try:
            doc = json.loads(body or b"{}")
        except ValueError:
            raise HubError(400, None, "Malformed JSON body") from None
        if not isinstance(doc, dict):
            raise HubError(400, None, "JSON body must be an object")
        paths, expand = doc.get("paths", []), bool(doc.get("expand", False))
    else:
        form = parse_qs(body.decode("utf-8", "replace"))
        paths, expand = form.get("paths", []), form.get("expand", ["false"])[0].lower() == "true"
    if isinstance(paths, str):
        paths = [paths]
    if not isinstance(paths, list):
        raise HubError(400, None, "paths must be a string or a list of strings")
    return paths, expand


def info_body(repo_id: str, sha: str, date: datetime | None, files: Iterable[str]) -> dict[str, Any]:
    """`GET /api/{type}s/{repo}[/revision/{rev}]`: the fields huggingface_hub's RepoInfo reads."""
    return {
        "id": repo_id,
        "sha": sha,
        "author": repo_id.split("/")[0],
        "private": False,
        "gated": False,
        "disabled": False,
        "lastModified": iso_time(date),
        "tags": [],
        "downloads": 0,
        "likes": 0,
        "siblings": [{"rfilename": p} for p in sorted(files)],
    }
