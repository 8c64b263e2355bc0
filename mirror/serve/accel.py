"""Handing a GET to nginx (serve --accel-redirect): which requests nginx answers exactly as serve would,
and the body-less answer that tells nginx where the blob lies."""

from __future__ import annotations

import re
from typing import Literal

# What nginx's static file handler would answer otherwise than serve, which ignores them (a 304, a 412,
# If-Range's whole-file 200): a GET carrying one is streamed by serve itself, even behind nginx.
CONDITIONAL = frozenset({b"if-range", b"if-match", b"if-none-match", b"if-modified-since", b"if-unmodified-since"})
# A single range that nginx's range filter and parse_range read alike. Anything else (spaces, `Bytes=`,
# several ranges: serve sends the whole file, nginx a 206, a multipart or a 416) is streamed by serve.
PLAIN_RANGE = re.compile(r"bytes=(\d{1,18}-\d{0,18}|-\d{1,18})", re.ASCII)


def accel_ok(headers: list[tuple[bytes, bytes]], rng: tuple[int, int] | Literal["unsatisfiable"] | None) -> bool:
    """Whether a GET came through nginx-conf's nginx and nginx would answer it as serve does: no
    conditional header, and no Range or a plain satisfiable one (`rng`: parse_range's reading)."""
    nginx, plain = False, True
    for name, value in headers:
        if name in CONDITIONAL:
            return False
        if name == b"x-sendfile-type":
            nginx = value == b"X-Accel-Redirect"
        elif name == b"range":
            plain = rng is not None and PLAIN_RANGE.fullmatch(value.decode("latin-1")) is not None
    return nginx and plain


def accel_headers(fixed: tuple[tuple[bytes, bytes], ...], ranged: bool) -> tuple[tuple[bytes, bytes], ...]:
    """The answer that hands a GET to nginx: the file's headers and no body; where nginx finds it
    (X-Accel-Redirect) is the integrity's word (handoff), once the blob was verified.
    nginx keeps only Content-Type and Accept-Ranges of a redirecting answer (the internal location
    puts X-Repo-Commit, ETag and X-Linked-* back from `$upstream_http_*`; Content-Length and
    Content-Range are its own). Its range filter adds `Accept-Ranges: bytes` to a 200 but not to a
    206, so ours goes along only with a Range: either way the client sees it once, as from serve.
    Content-Length 0 lets nginx keep the connection to this replica alive."""
    kept = tuple(h for h in fixed if ranged or h[0] != b"accept-ranges")
    return (*kept, (b"content-length", b"0"))
