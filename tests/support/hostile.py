"""A hostile upstream: an HTTP proxy in front of the fake Hub that forwards everything but, per rule,
replaces chosen answers — bytes that are not JSON, JSON of the wrong shape or nested 100k deep, a body
that never ends or trickles, `Link: rel=next` pages without end, redirect loops and redirects off http,
a listed file that 404s. What a compromised or broken mirror, or a captive portal, could send.

    with HostileProxy(hub.url) as proxy:
        proxy.rule("/refs", not_json())
        run_cli("--endpoint", proxy.url, "stage", ...)

A rule matches a substring of the raw request path (with query); the first matching rule answers, and
`proxy.hits(rule)` counts how often it did. Unmatched requests are forwarded unchanged (with the
client's Host header, so the fake Hub's `Link` URLs point back through the proxy).
"""

from __future__ import annotations

import http.client
import itertools
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from tests.support.fakehub import git_blob_oid

_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "proxy-connection"}


@dataclass
class Forwarded:
    """The upstream's answer, read whole (the fake Hub's answers are small)."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def json(self):
        return json.loads(self.body)


Answer = Callable[["_Handler", Callable[[], Forwarded]], None]


@dataclass(eq=False)
class Rule:
    match: str
    answer: Answer
    times: int | None = None  # None: every matching request
    hits: int = 0


@dataclass
class HostileProxy:
    upstream: str
    rules: list[Rule] = field(default_factory=list)

    def __post_init__(self):
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.proxy = self  # type: ignore[attr-defined]
        self._stop = threading.Event()
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def rule(self, match: str, answer: Answer, times: int | None = None) -> Rule:
        r = Rule(match, answer, times)
        with self._lock:
            self.rules.append(r)
        return r

    def hits(self, rule: Rule) -> int:
        with self._lock:
            return rule.hits

    def _take(self, path: str) -> Rule | None:
        with self._lock:
            for r in self.rules:
                if r.match in path and (r.times is None or r.hits < r.times):
                    r.hits += 1
                    return r
        return None

    def close(self) -> None:
        self._stop.set()  # endless answers end at their next chunk
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> HostileProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    timeout = 30

    def log_message(self, *args) -> None:
        pass

    def handle(self) -> None:
        try:
            super().handle()
        except OSError:  # the client hung up on an answer it had read enough of: what a cap does
            pass

    @property
    def proxy(self) -> HostileProxy:
        return self.server.proxy  # type: ignore[attr-defined]

    def do_GET(self):
        self._handle()

    do_HEAD = do_POST = do_GET

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.body = self.rfile.read(length) if length else b""
        rule = self.proxy._take(self.path)
        forward = lambda: self.forward()  # noqa: E731 - a rule may not need the upstream at all
        try:
            (rule.answer if rule else send_forwarded)(self, forward)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def forward(self) -> Forwarded:
        u = urlsplit(self.proxy.upstream)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
            conn.request(self.command, self.path, body=self.body or None, headers=headers)
            r = conn.getresponse()
            return Forwarded(r.status, [(k, v) for k, v in r.getheaders() if k.lower() not in _HOP], r.read())
        finally:
            conn.close()

    def send(self, status: int, body: bytes, headers: list[tuple[str, str]] = (), length: int | None = None) -> None:
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def stream(self, chunks, status: int = 200, headers: list[tuple[str, str]] = (), length: int | None = None):
        """Send `chunks` (an iterator of bytes) as they come; close-delimited unless `length` is given."""
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        if length is not None:
            self.send_header("Content-Length", str(length))
        else:
            self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        for chunk in chunks:
            if self.proxy._stop.is_set():
                return
            self.wfile.write(chunk)
            self.wfile.flush()


def send_forwarded(h: _Handler, forward: Callable[[], Forwarded]) -> None:
    f = forward()
    h.send(f.status, f.body, f.headers)


# -- answers -----------------------------------------------------------------------------------


def replace(body: bytes | str, status: int = 200, content_type: str = "application/json") -> Answer:
    data = body.encode() if isinstance(body, str) else body
    return lambda h, fwd: h.send(status, data, [("Content-Type", content_type)])


def not_json() -> Answer:
    return replace("<html><body>Sign in to the Wi-Fi</body></html>", content_type="text/html")


def as_json(doc) -> Answer:
    return replace(json.dumps(doc))


def deep_json(depth: int = 100_000) -> Answer:
    return replace("[" * depth + "]" * depth)


def edit_json(fn: Callable[[object], object]) -> Answer:
    """The upstream's own JSON answer, changed by `fn` (which may edit in place and return None)."""

    def answer(h: _Handler, fwd):
        f = fwd()
        doc = f.json()
        out = fn(doc)
        h.send(f.status, json.dumps(doc if out is None else out).encode(), f.headers)

    return answer


def endless(status: int = 500, chunk: int = 1 << 16) -> Answer:
    """A body that never ends (close-delimited, no Content-Length): until the client hangs up."""
    block = b"x" * chunk
    return lambda h, fwd: h.stream(itertools.repeat(block), status, [("Content-Type", "text/plain")])


def huge(nbytes: int, status: int = 200) -> Answer:
    """An answer that says (Content-Length) and sends `nbytes` of spaces: a 256 MiB metadata.json."""
    block = b" " * (1 << 16)

    def chunks():
        for _ in range(nbytes // len(block)):
            yield block

    return lambda h, fwd: h.stream(chunks(), status, [("Content-Type", "application/json")], length=nbytes)


def trickle(interval: float) -> Answer:
    """The upstream's answer, one byte every `interval` seconds (each read well inside any read timeout)."""

    def answer(h: _Handler, fwd):
        f = fwd()

        def chunks():
            for i in range(len(f.body)):
                time.sleep(interval)
                yield f.body[i : i + 1]

        h.stream(chunks(), f.status, f.headers, length=len(f.body))

    return answer


def endless_pages() -> Answer:
    """The upstream's first page, then empty pages, each with a `Link: rel="next"` to one more."""

    def answer(h: _Handler, fwd):
        path, _, query = h.path.partition("?")
        n = int(query.rsplit("hostile_page=", 1)[1]) if "hostile_page=" in query else 0
        f = fwd() if n == 0 else Forwarded(200, [("Content-Type", "application/json")], b"[]")
        nxt = f"{path}?hostile_page={n + 1}"
        headers = [(k, v) for k, v in f.headers if k.lower() != "link"]
        headers.append(("Link", f'<http://{h.headers["Host"]}{nxt}>; rel="next"'))
        h.send(f.status, f.body, headers)

    return answer


def redirect(location: str, status: int = 302) -> Answer:
    return lambda h, fwd: h.send(status, b"", [("Location", location)])


def redirect_loop() -> Answer:
    """A 302 to itself, for ever."""
    return lambda h, fwd: h.send(302, b"", [("Location", h.path)])


def status(code: int, error_code: str | None = None) -> Answer:
    headers = [("Content-Type", "text/plain")] + ([("X-Error-Code", error_code)] if error_code else [])
    return lambda h, fwd: h.send(code, b"gone", headers)


def extra_entries(n: int, under: str) -> Answer:
    """Each tree page with `n` more files under `under` (build/<variant>/)."""

    pages = itertools.count()

    def add(page):
        if isinstance(page, list):  # new names on every page: a listing that only grows
            p = next(pages)
            page.extend(
                {"type": "file", "oid": "0" * 40, "size": 1, "path": f"{under}extra-{p}-{i}.py"} for i in range(n)
            )

    return edit_json(add)


def tree_file_field(name: str, value) -> Answer:
    """Every file entry of a tree page with field `name` set to `value`."""

    def edit(page):
        for e in page:
            if e.get("type") == "file":
                e[name] = value

    return edit_json(edit)


def swap_metadata(body: bytes) -> tuple[Answer, Answer]:
    """A tree answer naming `body` as every metadata.json (its git oid and size), and the file's own
    answer sending it: what a publisher's hostile metadata.json looks like end to end."""

    def edit(page):
        for e in page:
            if e.get("path", "").endswith("/metadata.json"):
                e.update(oid=git_blob_oid(body), size=len(body))
                e.pop("lfs", None)

    return edit_json(edit), replace(body)
