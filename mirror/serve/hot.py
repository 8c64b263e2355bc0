"""The hot path's table: the whole-file answers serve gave before, keyed by the raw request path, so that
a repeat (a HEAD per file per snapshot is most of a client's traffic) skips routing and Starlette
(MirrorApp.hot), and a HEAD even the ASGI app (MirrorApp.fast_head, from limits.guarded)."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, NamedTuple

from .accel import CONDITIONAL
from .catalog import Catalog, ServedFile
from .pin import marked

if TYPE_CHECKING:
    from starlette.types import Scope

HOT_MAX = 8192  # resolve URLs remembered
DECLINED = frozenset({b"range", b"transfer-encoding", *CONDITIONAL})  # headers the slow way answers


class HotEntry(NamedTuple):
    catalog: Catalog  # the one the answer was built from: another one, and the entry is stale
    file: ServedFile
    headers: tuple[tuple[bytes, bytes], ...]  # the answer's raw (name, value) pairs, Content-Length included
    accel: tuple[tuple[bytes, bytes], ...] | None  # the answer that hands a GET to nginx (serve --accel-redirect)
    lines: bytes  # `headers` as the header lines fast_head writes


class HotTable:
    def __init__(self) -> None:
        # Keyed by raw path; looked up with scope.get("raw_path"): a scope without one (None) misses.
        self._entries: dict[bytes | None, HotEntry] = {}

    def remember(
        self,
        raw: bytes,
        catalog: Catalog,
        f: ServedFile,
        headers: tuple[tuple[bytes, bytes], ...],
        accel: tuple[tuple[bytes, bytes], ...] | None,
    ) -> None:
        if len(self._entries) >= HOT_MAX:  # distinct spellings of one URL must not grow it without bound
            self._entries.clear()
        lines = b"".join(b"%s: %s\r\n" % h for h in headers)
        self._entries[raw] = HotEntry(catalog, f, headers, accel, lines)

    def hit(
        self, scope: Scope, catalog: Catalog, bad: Collection[str], authorized: Callable[[str | None], bool]
    ) -> tuple[HotEntry, bool] | None:
        """This request's entry, and whether nginx forwarded it; None: not remembered, from an older
        catalog, a blob found bad, a Range or a condition (the slow way parses them), a token that fails,
        a body (no client sends one with a GET: the slow way closes the connection after answering, where
        here the rest of an endless one would be read and dropped for as long as it came)."""
        hit = self._entries.get(scope.get("raw_path"))
        if hit is None or hit.catalog is not catalog or (bad and hit.file.sha256 in bad) or marked(scope):
            return None  # (marked: the one self-redirect of an answer whose blob was evicted, pin.py)
        auth, nginx = None, False
        for name, value in scope["headers"]:
            if name in DECLINED or (name == b"content-length" and value != b"0"):
                return None
            if name == b"authorization" and auth is None:
                auth = value.decode("latin-1")
            elif name == b"x-sendfile-type":
                nginx = value == b"X-Accel-Redirect"
        if not authorized(auth):
            return None
        return hit, nginx
