"""serve's HTTP limits: how much of serve one client can hold, and for how long.

uvicorn has some of them and they are used as they are: `limit_concurrency` (past it a request is
answered 503 at once), `timeout_keep_alive` (an idle connection between two requests is closed). It
has no limit on the size of a request's header and no timeout while one is being sent: with httptools
(uvicorn[standard]'s parser) an endless header was buffered whole (80 -> 617 MB RSS at 300 MiB sent)
and its re-parsing stalled every other client, and a connection that sent nothing, or half a request
line, was kept forever (1,100 of them under nofile=1024 and real clients were refused).
(`h11_max_incomplete_event_size` only applies to the h11 parser, several times slower.)

So serve runs uvicorn's own httptools protocol with a small guard (`guarded`) in front of its parser:
- at most `max_header_bytes` of a request's line and header are fed to the parser; past that the
  client gets 431 and the connection is closed;
- a request's head must arrive within `header_timeout` seconds of its first byte (or of the
  connection, for a client that sends nothing): past that 408 (or, before any byte, just the close).
And serve raises its own open-file limit so that `max_connections` sockets fit under it.
"""

from __future__ import annotations

import logging
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from frt.resolver.errors import FrtError
from frt.resolver.settings import env_number

if TYPE_CHECKING:
    import asyncio

    from starlette.types import Scope

    from .sendfile import FileSend

log = logging.getLogger("uvicorn.error")

# A client's request line and headers: a few hundred bytes (a bearer token, a Range); nginx's
# large_client_header_buffers hold 4 x 8 KiB. 64 KiB leaves room for odd proxies, not for 300 MiB.
MAX_HEADER_BYTES = 64 << 10
# Seconds to send a request's head once started: generous for any link that carries a download.
HEADER_TIMEOUT = 20.0
# A client's pool leaves a connection idle between a HEAD and its GET, seconds on a busy node;
# uvicorn's default 5 s closed it under a GET being sent (RemoteProtocolError). nginx's 75 s.
KEEP_ALIVE_S = 75
# Open connections per serve process (per worker with --workers); the next request is answered 503.
MAX_CONNECTIONS = 2048
# Open files besides the connections: the store's blobs being sent, the ledger, logs, the listeners.
SPARE_FILES = 256
# What a lingering close waits, discarding what the client still sends, so that it reads the 431
# before the close: closing a socket with unread bytes resets it, and the reset can drop the answer.
LINGER_S = 2.0


@dataclass(frozen=True)
class HttpLimits:
    max_header_bytes: int = MAX_HEADER_BYTES
    header_timeout: float = HEADER_TIMEOUT
    keep_alive_timeout: int = KEEP_ALIVE_S
    max_connections: int = MAX_CONNECTIONS

    # name -> (environment variable, kind, lowest, highest): serve's options read the same variables.
    ENV = {
        "max_header_bytes": ("FRT_SERVE_MAX_HEADER_BYTES", int, 1024, 16 << 20),
        "header_timeout": ("FRT_SERVE_HEADER_TIMEOUT", float, 0.1, 3600),
        "keep_alive_timeout": ("FRT_SERVE_KEEP_ALIVE_TIMEOUT", int, 1, 3600),
        "max_connections": ("FRT_SERVE_MAX_CONNECTIONS", int, 1, 1 << 20),
    }

    @classmethod
    def from_env(cls) -> HttpLimits:
        """The limits FRT_SERVE_* name, the defaults for the rest; a bad value is one line (BadInput)."""
        return cls(
            **{f: env_number(var, getattr(cls, f), kind, low, high) for f, (var, kind, low, high) in cls.ENV.items()}
        )

    def environ(self) -> dict[str, str]:
        """These limits as FRT_SERVE_* variables: how serve --workers hands them to its forked workers."""
        return {var: str(getattr(self, f)) for f, (var, *_rest) in self.ENV.items()}

    def uvicorn(self) -> dict[str, Any]:
        """uvicorn.Config's own settings for these limits, and the guarded protocol for the rest."""
        # uvicorn answers 503 once len(connections) >= limit_concurrency, counting the asking one: +1, so
        # that max_connections connections are served and the one past them refused.
        return {
            "http": guarded(self),
            "limit_concurrency": self.max_connections + 1,
            "timeout_keep_alive": self.keep_alive_timeout,
        }


def raise_open_files(limits: HttpLimits) -> None:
    """Raise this process's soft RLIMIT_NOFILE (often 1024) toward its hard limit, enough for
    max_connections sockets and SPARE_FILES besides; if the hard limit is lower, say so once."""
    want = limits.max_connections + SPARE_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        if new < want:
            log.warning(
                "frt-mirror: the open-file limit (%d) is below --max-connections %d + %d: past about "
                "%d connections new ones wait in the listen backlog (raise it: ulimit -n, LimitNOFILE=)",
                new,
                limits.max_connections,
                SPARE_FILES,
                new - SPARE_FILES,
            )


class _Answered:
    """The request-response cycle of a HEAD the protocol answered itself (fast_head): complete, so that
    uvicorn's callbacks after the headers (the message's end, a lost connection) leave it be."""

    response_complete = True

    class message_event:  # connection_lost sets it, for a request body nobody waits on here
        @staticmethod
        def set() -> None:
            pass


class _LingeringClose:
    """The transport as the answer to a request with a body sees it: its close (uvicorn's, after an answer
    with `Connection: close`: a body the app did not read to its end) is a lingering one, as for a 431,
    so that a client still sending its body reads the answer (a 413) before the close."""

    def __init__(self, protocol: Any) -> None:
        self._protocol = protocol

    def __getattr__(self, name: str) -> Any:
        return getattr(self._protocol.transport, name)

    def close(self) -> None:
        self._protocol.linger()


class _Sending:
    """The request-response cycle of a GET the protocol sends itself with sendfile (fast_get): uvicorn
    queues a pipelined request behind it, and a shutdown asks it not to keep the connection alive."""

    def __init__(self) -> None:
        self.response_complete, self.disconnected, self.keep_alive = False, False, True
        self.more_body, self.body = True, b""
        self.message_event = _Answered.message_event


# What GuardedHttpTools takes of uvicorn's httptools protocol past asyncio's Protocol: uvicorn's private
# internals, which any release may rename. The versions CI tested are in constraints.txt.
_PROTOCOL_METHODS = ("on_headers_complete", "on_message_complete", "on_response_complete", "on_message_begin")
_PROTOCOL_STATE = ("cycle", "parser", "tasks", "root_path", "server_state", "loop", "transport", "url", "scope")
_CYCLE_STATE = ("response_complete", "keep_alive")
_PARSER_METHODS = ("get_method", "get_http_version", "should_keep_alive")
_STATUS_LINES = (200, 408, 431)


def uvicorn_gaps() -> list[str]:
    """What `guarded` needs of this uvicorn's httptools protocol and does not find (empty: all of it). The
    state it reads is what __init__ or on_message_begin assigns (their code's names), not just a hasattr."""
    import httptools
    from uvicorn.protocols.http import httptools_impl as impl
    from uvicorn.server import ServerState

    proto, cycle = impl.HttpToolsProtocol, getattr(impl, "RequestResponseCycle", None)
    assigned = {n for f in (proto.__init__, getattr(proto, "on_message_begin", None)) if f for n in f.__code__.co_names}
    gaps = [f"HttpToolsProtocol.{m}" for m in _PROTOCOL_METHODS if not callable(getattr(proto, m, None))]
    gaps += [f"HttpToolsProtocol.{a}" for a in _PROTOCOL_STATE if a not in assigned]
    cycle_names = set(cycle.__init__.__code__.co_names) if cycle else set()
    gaps += [f"RequestResponseCycle.{a}" for a in _CYCLE_STATE if a not in cycle_names]
    gaps += [f"HttpRequestParser.{m}" for m in _PARSER_METHODS if not hasattr(httptools.HttpRequestParser, m)]
    gaps += [f"STATUS_LINE[{c}]" for c in _STATUS_LINES if c not in getattr(impl, "STATUS_LINE", {})]
    if not hasattr(ServerState(), "default_headers"):
        gaps.append("ServerState.default_headers")
    return gaps


def guarded(
    limits: HttpLimits,
    fast: Callable[[Scope, float], bytes | None] | None = None,
    fast_get: Callable[[Scope, float], FileSend | None] | None = None,
) -> type:
    """uvicorn's httptools protocol with the header size limit and the header timeout (see above), and
    `fast` (MirrorApp.fast_head): the header lines of a HEAD answered without the app, or None;
    `fast_get` (sendfile.hot_get): a whole-file GET's sendfile.FileSend, or None.
    uvicorn is imported here, not above: the CLI reads this module's defaults for serve's --help."""
    import httptools
    import uvicorn
    from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

    from .protocol import declares_body
    from .sendfile import send

    if gaps := uvicorn_gaps():  # at start, in one line: not a 500 on the first request that meets the gap
        raise FrtError(
            f"uvicorn {uvicorn.__version__}: its httptools protocol has no {', '.join(gaps)}, which serve's HTTP "
            "limits build on (mirror/serve/limits.py); install the versions CI tested: pip install -c constraints.txt"
        )

    ok = STATUS_LINE[200]

    max_head, timeout = limits.max_header_bytes, limits.header_timeout

    class GuardedHttpTools(HttpToolsProtocol):
        _head_open = True  # the next bytes are a request's line and header
        _head_seen = 0  # bytes of them so far
        _head_timer = None
        _lingering = False
        _messages = 0  # requests whose whole message the parser has seen

        # asyncio.Transport, as uvicorn's own override declares it (and ignores [override] for)
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()  # a client that connects and sends nothing is closed too

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._lingering:  # answered and closing: what it still sends is dropped unread
                return
            if not self._head_open:
                return super().data_received(data)
            if self._head_timer is None:
                self._arm()  # the first byte of a request on a kept-alive connection
            room = max_head - self._head_seen
            if len(data) <= room:
                self._head_seen += len(data)
                return super().data_received(data)
            # Only `room` more bytes reach the parser: 431 unless the head ends within them. The rest (a
            # body, a pipelined request) goes through this same check. A head that began inside a chunk
            # fed whole is counted from the next chunk on: a head gets at most twice max_head bytes.
            done, self._head_seen = self._messages, 0
            super().data_received(data[:room])
            if self.transport.is_closing():
                return
            if self._head_open and self._messages == done:
                return self._refuse(431, f"request line and headers over {max_head} bytes")
            self.data_received(data[room:])

        def on_headers_complete(self) -> None:
            self._head_open = False
            self._disarm()
            if not self._answer_head() and not self._answer_get():
                super().on_headers_complete()
                # A body the app may not read to its end: closed lingering (see protocol.BodyRequest).
                if self.cycle is not None and declares_body(self.scope["headers"]):
                    self.cycle.transport = _LingeringClose(self)  # type: ignore[assignment]

        def _fast_scope(self, method: bytes) -> Scope | None:
            """The scope of a keep-alive HTTP/1.1 `method` request with no query and no %-escape, nothing
            before it in flight; None for any other."""
            p = self.parser
            if p.get_method() != method or p.get_http_version() != "1.1" or not p.should_keep_alive():
                return None
            if (self.cycle is not None and not self.cycle.response_complete) or self.root_path:
                return None
            url = httptools.parse_url(self.url)
            if url.query is not None or b"%" in url.path:
                return None
            scope = self.scope
            scope.update(method=method.decode(), path=url.path.decode("ascii"), raw_path=url.path, query_string=b"")
            return scope

        def _head_lines(self, lines: bytes) -> bytes:
            """The answer's head as uvicorn would write it (its Date header included)."""
            return b"".join([ok, *(b"%s: %s\r\n" % h for h in self.server_state.default_headers), lines, b"\r\n"])

        def _answer_head(self) -> bool:
            """A HEAD that `fast` answers: written here."""
            t0 = time.perf_counter()
            if fast is None or (scope := self._fast_scope(b"HEAD")) is None or (lines := fast(scope, t0)) is None:
                return False
            self.transport.write(self._head_lines(lines))
            self.cycle = _Answered()  # type: ignore[assignment]
            self.on_response_complete()  # uvicorn's keep-alive timer and the next pipelined request
            return True

        def _answer_get(self) -> bool:
            """A whole-file GET that `fast_get` sends with sendfile, in a task of its own, once nothing of
            an earlier answer is still queued in the transport (its bytes must go first)."""
            t0 = time.perf_counter()
            if fast_get is None or self.transport.get_write_buffer_size():
                return False
            if (scope := self._fast_scope(b"GET")) is None or (fs := fast_get(scope, t0)) is None:
                return False
            cycle = self.cycle = _Sending()  # type: ignore[assignment]
            sock = self.transport.get_extra_info("socket")
            task = self.loop.create_task(self._send(cycle, sock.fileno(), fs))
            task.add_done_callback(self.tasks.discard)
            self.tasks.add(task)  # a graceful shutdown waits for it, as for an app's
            return True

        async def _send(self, cycle: _Sending, sock_fd: int, fs: FileSend) -> None:
            sent = None
            try:
                sent = await send(self.loop, sock_fd, self._head_lines(fs.lines), fs)
            except OSError:  # the client went away, or the file ended early
                pass
            except Exception:  # never leave the connection waiting on an answer that will not come
                log.exception("frt-mirror: serve: a sendfile answer failed")
            fs.finish(200, sent or 0)  # where no tail went; else counted as it went (FileSend.finish)
            cycle.response_complete = True
            if sent is None or not cycle.keep_alive or self.transport.is_closing():
                self.transport.close()  # cut short: the client sees fewer bytes than Content-Length
                return
            self.on_response_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._messages += 1
            self._head_open, self._head_seen = True, 0  # uvicorn's keep-alive timer covers the wait

        def _arm(self) -> None:
            self._head_timer = self.loop.call_later(timeout, self._head_timed_out)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if self.transport.is_closing() or not self._head_open:
                return
            if self.cycle is not None and not self.cycle.response_complete:
                return self._arm()  # a pipelined head behind an answer in flight: that answer first
            if self._head_seen:
                return self._refuse(408, f"request line and headers not received within {timeout:g} s")
            self.transport.close()

        def _refuse(self, status: int, why: str) -> None:
            """One plain-text answer and a lingering close (see LINGER_S)."""
            body = f"{why}\n".encode()
            head = [STATUS_LINE[status]]
            for name, value in self.server_state.default_headers:
                head += [name, b": ", value, b"\r\n"]
            head += [
                b"content-type: text/plain; charset=utf-8\r\n",
                b"content-length: ",
                str(len(body)).encode(),
                b"\r\nconnection: close\r\n\r\n",
                body,
            ]
            self.transport.write(b"".join(head))
            self.linger()

        def linger(self) -> None:
            """Close after the answer, reading on for LINGER_S and dropping what comes."""
            self._lingering = True
            self._disarm()
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)

    return GuardedHttpTools
