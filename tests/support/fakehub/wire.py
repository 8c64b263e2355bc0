"""HTTP plumbing shared by the fake Hub's two hosts (the Hub itself and its CDN).

Both kinds of handler log every answer into the hub's one request log, register their connections so
that `FakeHub.stop()` can sever them, and stream file bodies through the same fault hooks (drop,
throttle) and the same in-flight counter.
"""

from __future__ import annotations

import json
import socket
import time
import traceback
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, NamedTuple
from urllib.parse import parse_qsl, unquote, urlsplit

if TYPE_CHECKING:
    from .server import FakeHub

CHUNK = 1 << 20


class HubError(Exception):
    """An error answer; `code` becomes X-Error-Code (None: a bare status, as for injected faults)."""

    def __init__(self, status: int, code: str | None, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}


class LoggedRequest(NamedTuple):
    """One answered request: `server` is "hub" or "cdn"; `headers` are the request's headers; `at` is
    time.monotonic() when the answer started."""

    method: str
    path: str
    status: int
    server: str
    headers: dict
    at: float


class BaseHandler(BaseHTTPRequestHandler):
    # Headers and body go out in separate writes; without TCP_NODELAY every keep-alive
    # request stalls ~40 ms on the client's delayed ACK.
    disable_nagle_algorithm = True
    protocol_version = "HTTP/1.1"  # keep-alive; so every answer carries Content-Length
    server_version = "FakeHub/1.0"
    timeout = 60  # idle keep-alive connections give their thread back eventually
    server_kind = "hub"

    @property
    def hub(self) -> FakeHub:
        return self.server.hub  # type: ignore[attr-defined]

    def setup(self):
        super().setup()
        self.hub._track(self.connection, True)
        self.extra_headers: dict = {}  # added to every answer by end_headers

    def finish(self):
        self.hub._track(self.connection, False)
        try:
            super().finish()
        except OSError:  # a connection severed by stop(): nothing left to flush
            pass

    def handle(self):
        try:
            super().handle()
        except OSError:  # severed by stop() between requests
            self.close_connection = True

    def log_message(self, format, *args):  # silence stderr
        pass

    def log_request(self, code="-", size="-"):  # called by send_response: one log entry per answer
        headers = dict(self.headers.items()) if getattr(self, "headers", None) else {}
        self.hub._log(
            LoggedRequest(
                self.command or "-", getattr(self, "path", "-"), int(code), self.server_kind, headers, time.monotonic()
            )
        )

    def end_headers(self):
        for k, v in self.extra_headers.items():  # e.g. RateLimit: on every answer of a bucket
            self.send_header(k, str(v))
        super().end_headers()

    def do_GET(self):
        self._handle()

    def do_HEAD(self):
        self._handle()

    def do_POST(self):
        self._handle()

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.body = self.rfile.read(length) if length else b""  # drain it, or keep-alive desyncs
        self._sent_headers = False
        self.extra_headers = {}
        parts = urlsplit(self.path)
        self.query = dict(parse_qsl(parts.query, keep_blank_values=True))
        # Split the *raw* path first, then decode each segment: "release%2Fv1" stays one segment.
        self.segs = [unquote(s) for s in parts.path.split("/")[1:]]
        try:
            if (pause := self.hub.faults.delay_for(self.path)) > 0:
                time.sleep(pause)
            if (status := self.hub.faults.take_failure(self.path)) is not None:
                raise HubError(status, None, f"injected fault {status}")
            self._route()
        except HubError as e:
            self._send_error(e)
        except OSError:  # the client went away, or stop() severed the connection
            self.close_connection = True
        except Exception as e:  # a bug in the fake: answer 500 loudly rather than hang the client
            traceback.print_exc()
            if self._sent_headers:
                self.close_connection = True
            else:
                self._send_error(HubError(500, None, f"fakehub bug: {e!r}"))

    def _route(self) -> None:
        raise NotImplementedError

    def _send(self, status: int, body: bytes, headers: dict, content_type: str | None = None) -> None:
        self.send_response(status)
        if content_type:
            self.send_header("Content-Type", content_type)
        for k, v in headers.items():
            self.send_header(k, str(v))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self._sent_headers = True
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_json(self, obj, headers: dict | None = None, status: int = 200) -> None:
        self._send(status, json.dumps(obj).encode(), headers or {}, "application/json; charset=utf-8")

    def _send_error(self, e: HubError) -> None:
        headers = dict(e.headers)
        if e.code:
            headers["X-Error-Code"] = e.code
            headers["X-Error-Message"] = e.message
        self._send_json({"error": e.message}, headers, e.status)

    def _serve_bytes(self, data: bytes, headers: dict) -> None:
        """200 with `data`, or 206 for a single `Range`, or 416; streamed through the fault hooks."""
        status, start, end = 200, 0, len(data)
        rng = parse_range(self.headers.get("Range"), len(data))
        if rng is not None and self.hub.faults.ranges_ignored(self.path):
            rng = None
        if rng == "unsatisfiable":
            keep = {k: v for k, v in headers.items() if k == "X-Repo-Commit"}
            raise HubError(
                416, None, "Requested Range Not Satisfiable", {"Content-Range": f"bytes */{len(data)}", **keep}
            )
        if rng is not None:
            status, (start, end) = 206, rng
            headers = {**headers, "Content-Range": f"bytes {start}-{end - 1}/{len(data)}"}
        drop = self.hub.faults.take_drop(self.path) if self.command == "GET" else None

        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        for k, v in headers.items():
            self.send_header(k, str(v))
        self.send_header("Content-Length", str(end - start))
        self.end_headers()
        self._sent_headers = True
        if self.command == "HEAD":
            return
        view = memoryview(data)[start:end]
        if drop is not None:
            view = view[:drop]
        rate = self.hub.faults.rate_for(self.path)
        step = CHUNK if rate is None else max(1, min(CHUNK, int(rate / 20)))
        self.hub._body(+1)
        try:
            if (held := self.hub.faults.hold_for(self.path)) is not None:
                self.wfile.write(view[:held])
                self.wfile.flush()
                self.hub.faults.wait_released()
                view = view[held:]
            began = time.monotonic()
            for off in range(0, len(view), step):  # stream: no per-request copy of a large body
                self.wfile.write(view[off : off + step])
                self.hub._sent(min(step, len(view) - off))
                if rate is not None:  # paced by the clock: a link of `rate`, not `rate` less each write's time
                    if (ahead := began + (off + step) / rate - time.monotonic()) > 0:
                        time.sleep(ahead)
        finally:
            self.hub._body(-1)
        if drop is not None:
            # Short body then EOF: the client sees fewer bytes than Content-Length promised.
            self.wfile.flush()
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.close_connection = True


def parse_range(header: str | None, size: int):
    """A single `bytes=s-e` / `bytes=s-` / `bytes=-n` range -> (start, end_exclusive).

    None: no usable Range (serve 200, as servers ignore syntax they do not understand);
    "unsatisfiable": answer 416.
    """
    if not header or not header.startswith("bytes=") or "," in header:
        return None
    first, _, last = header[6:].strip().partition("-")
    try:
        if first == "":  # suffix: the last n bytes
            n = int(last)
            return (max(size - n, 0), size) if n > 0 and size > 0 else "unsatisfiable"
        start = int(first)
        end = int(last) + 1 if last else size
    except ValueError:
        return None
    if start >= size or end <= start:
        return "unsatisfiable"
    return start, min(end, size)
