"""serve's access log: one line per request.

    127.0.0.1 - - [2026-05-01T08:40:12Z] "HEAD /kernels/org/x/resolve/v1/build/a.py HTTP/1.1" 200 0 0.213ms

The Common Log Format's fields (client, time, request line, status, body bytes sent), then the time the
request took, in milliseconds. The path is the raw one the client sent, percent-encoding and query kept:
that is what was routed, and what an operator pastes back into curl. Bytes outside printable ASCII, `"`
and `\\` are written as `\\xHH`, so a hostile path cannot forge a line or a field. Body bytes are what
the mirror handed to the server (a client that hung up mid-body got fewer).

HEAD is the hot path (one per file per snapshot, answered by MirrorApp.hot in a few microseconds), so a
record costs a clock read, a dict lookup for the escaped path and one format; the lines of one turn of
the event loop go out in one write, at the start of the next turn (no line waits longer than that).
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from starlette.types import Message, Scope, Send

_UNSAFE = re.compile(rb"[^\x21\x23-\x5b\x5d-\x7e]")  # printable ASCII except space, `"` and `\`
_PATHS_MAX = 8192  # escaped paths remembered (clients ask the same few thousand URLs over and over)


def escape(raw: bytes) -> str:
    if _UNSAFE.search(raw) is None:
        return raw.decode("ascii")
    return _UNSAFE.sub(lambda m: b"\\x%02x" % m[0][0], raw).decode("ascii")


class LogSink:
    """Batched, unbuffered appends to one file descriptor (a file, stdout or stderr)."""

    def __init__(self, fd: int, close: bool = False) -> None:
        self.fd, self._close = fd, close
        self._lines: list[str] = []
        self._scheduled = False

    def add(self, line: str) -> None:
        self._lines.append(line)
        if self._scheduled:
            return
        try:
            asyncio.get_running_loop().call_soon(self.flush)
            self._scheduled = True
        except RuntimeError:  # no loop (shutting down): write now
            self.flush()

    def flush(self) -> None:
        self._scheduled = False
        if not self._lines:
            return
        data, self._lines = "".join(self._lines).encode(), []
        try:
            while data:
                data = data[os.write(self.fd, data) :]
        except OSError:  # a closed pipe or a full disk must not take the mirror down with it
            pass

    def close(self) -> None:
        self.flush()
        if self._close:
            os.close(self.fd)


class AccessLog:
    """Formats one request's line into a sink. `t0` is time.perf_counter() when the request came in."""

    def __init__(self, sink: LogSink) -> None:
        self.sink = sink
        self._paths: dict[bytes, str] = {}
        self._stamp = (0, "")

    def record(self, scope: Scope, status: int, nbytes: int, t0: float) -> None:
        ms = (time.perf_counter() - t0) * 1e3
        raw = scope.get("raw_path") or scope["path"].encode()
        if query := scope.get("query_string"):
            raw = raw + b"?" + query
        path = self._paths.get(raw)
        if path is None:
            if len(self._paths) >= _PATHS_MAX:
                self._paths.clear()
            path = self._paths[raw] = escape(raw)
        client = scope.get("client")
        flag = " stale" if "frt.stale" in scope else ""  # pull-through answered from the last known refs
        self.sink.add(
            f'{client[0] if client else "-"} - - [{self.now()}] "{scope["method"]} {path} '
            f'HTTP/{scope.get("http_version", "1.1")}" {status} {nbytes} {ms:.3f}ms{flag}\n'
        )

    def now(self) -> str:
        """The time field, formatted once per second (strftime per request would cost more than the rest)."""
        sec = int(time.time())
        if self._stamp[0] != sec:
            self._stamp = (sec, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(sec)))
        return self._stamp[1]


class Counted:
    """An ASGI `send` that notes the status and counts body bytes on their way out. `last(status, nbytes)`,
    where given, is called once, as the answer's last body message is handed on and before it goes: a
    worker killed just after its last bytes left has counted them (metrics.py). It stays set where no
    last message went (an answer cut short, an error before any): the caller counts those itself."""

    __slots__ = ("send", "status", "nbytes", "last")

    def __init__(self, send: Send, last: Callable[[int, int], None] | None = None) -> None:
        self.send, self.status, self.nbytes = send, 500, 0  # 500 stands if the app fails before answering
        self.last = last

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        else:
            self.nbytes += len(message.get("body", b""))
            if self.last is not None and not message.get("more_body", False):
                last, self.last = self.last, None
                last(self.status, self.nbytes)
        await self.send(message)


def open_sink(target: str | None) -> LogSink:
    """None: stderr (serve's default, next to its other messages); `-`: stdout; else a file, appended to."""
    if target is None:
        return LogSink(2)
    if target == "-":
        return LogSink(1)
    return LogSink(os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644), close=True)
