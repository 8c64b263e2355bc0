"""Wire details of the Hub protocol shared by the server: errors, raw paths, ranges."""

from __future__ import annotations

import re

from starlette.responses import JSONResponse

MAX_PATH = 4096
_PCT = re.compile(rb"%([0-9A-Fa-f]{2})")


class HubError(Exception):
    """An error answer. `code` becomes X-Error-Code, which is what huggingface_hub maps to
    RepositoryNotFoundError / RevisionNotFoundError / EntryNotFoundError (not the status)."""

    def __init__(self, status: int, code: str | None, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}

    def response(self, head: bool = False) -> JSONResponse:
        headers = dict(self.headers)
        headers["X-Error-Message"] = self.message.encode("ascii", "replace").decode()
        if self.code:
            headers["X-Error-Code"] = self.code
        resp = JSONResponse({"error": self.message}, status_code=self.status, headers=headers)
        if head:  # a HEAD answer has the headers, not the body
            resp.body = b""
        return resp


def split_raw_path(raw: bytes) -> list[str]:
    """Split the raw request path on "/", then percent-decode each segment strictly.

    Malformed escapes, non-UTF-8, NUL, and "." / ".." segments are a 400; an overlong path a 414.
    """
    if len(raw) > MAX_PATH:
        raise HubError(414, None, "Request path too long")
    raw = raw.split(b"?", 1)[0]
    segs = raw.strip(b"/").split(b"/") if raw.strip(b"/") else []
    out = []
    for seg in segs:
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


def parse_range(header: str | None, size: int):
    """`bytes=s-e`, `bytes=s-` or `bytes=-n` → (start, end_exclusive); None: serve it all;
    "unsatisfiable" → 416. A multi-range request is answered with the whole file, as RFC 9110 allows."""
    if not header:
        return None
    m = re.fullmatch(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*", header)
    if not m or (not m[1] and not m[2]):
        return None
    if not m[1]:
        n = int(m[2])
        if n == 0:
            return "unsatisfiable"
        return (max(0, size - n), size)
    start = int(m[1])
    end = min(int(m[2]) + 1, size) if m[2] else size
    if start >= size or (m[2] and int(m[2]) < start):
        return "unsatisfiable"
    return (start, end)
