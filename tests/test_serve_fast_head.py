"""A HEAD of a file served before is answered by serve's HTTP protocol itself (MirrorApp.fast_head,
limits.guarded): no ASGI task. Its answer must be, byte for byte but the Date, what the app answers; it
is logged and counted as any; pipelined requests behind it are answered in order; and what it declines
(HTTP/1.0, Connection: close, a query, a Range, a token that fails) goes through the app as before."""

from __future__ import annotations

import re
import socket
import time

import pytest

from tests.support.kernel_fixtures import ACTIVATION
from tests.support.serve_helpers import LINE, serving
from tests.support.serve_home import SO

URL = f"/kernels/{ACTIVATION}/resolve/v1/{SO}"


def head(path: str = URL, *headers: str, version: str = "1.1") -> bytes:
    return "\r\n".join([f"HEAD {path} HTTP/{version}", "Host: x", *headers, "", ""]).encode()


def answers(port: int, request: bytes, n: int) -> list[bytes]:
    """Send `request` (one or several pipelined) on one connection; the first `n` answers' heads."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        data = b""
        while data.count(b"\r\n\r\n") < n:
            chunk = s.recv(1 << 16)
            if not chunk:
                break
            data += chunk
    return [h + b"\r\n\r\n" for h in data.split(b"\r\n\r\n")[:n]]


def undated(answer: bytes) -> bytes:
    return re.sub(rb"\r\ndate: [^\r]*", b"", answer)


@pytest.fixture(scope="module")
def logged(serve_staged, tmp_path_factory):
    log = tmp_path_factory.mktemp("fast") / "access.log"
    with serving(serve_staged.home, "--access-log", str(log)) as served:
        yield served, log


def test_a_repeated_head_is_answered_as_the_app_answers_it(logged):
    served, _ = logged
    slow = answers(served.port, head(URL, "Connection: close"), 1)[0]  # declined: through the app
    first, second = answers(served.port, head() + head(), 2)  # the first fills the hot table
    assert slow.startswith(b"HTTP/1.1 200 OK\r\n") and b"x-repo-commit: " in slow
    assert undated(second) == undated(first) == undated(slow).replace(b"connection: close\r\n", b"")
    assert re.search(rb"\r\ndate: \w{3}, \d\d \w{3} \d{4} \d\d:\d\d:\d\d GMT\r\n", second)


def test_pipelined_requests_behind_it_are_answered_in_order(logged, serve_staged):
    served, _ = logged
    answers(served.port, head(), 1)
    api = f"GET /api/kernels/{ACTIVATION}/revision/v1 HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    got = answers(served.port, head() + api + head() + head(URL + "?x=1"), 4)
    assert [a.split(b"\r\n", 1)[0] for a in got[:1]] == [b"HTTP/1.1 200 OK"]
    assert b"content-type: application/json" in got[1]
    body_len = int(re.search(rb"content-length: (\d+)", got[1])[1])
    assert body_len > 0  # the JSON body sits between got[1] and got[2] in the stream
    assert b"x-repo-commit" in got[0]


def test_what_it_declines_goes_through_the_app(logged):
    served, log = logged
    answers(served.port, head(), 1)
    cases = [
        head(URL, version="1.0"),
        head(URL, "Connection: close"),
        head(URL + "?x=1"),
        head(URL, "Range: bytes=0-9"),
    ]
    for request in cases:
        got = answers(served.port, request, 1)[0]
        assert got.split(b" ", 2)[1] in (b"200", b"206"), (request, got)
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as s:
        s.sendall(head(URL, version="1.0"))
        assert s.recv(1 << 16).startswith(b"HTTP/1.1 200")
        assert s.recv(1 << 16) == b""  # HTTP/1.0 without keep-alive: closed after the answer, as before


def test_each_fast_answer_is_logged(logged):
    served, log = logged
    answers(served.port, head(), 1)
    time.sleep(0.3)
    before = sum(1 for ln in log.read_text().splitlines() if (m := LINE.fullmatch(ln)) and m["method"] == "HEAD")
    answers(served.port, head() * 5, 5)
    deadline = time.monotonic() + 10
    while True:
        lines = [m for ln in log.read_text().splitlines() if (m := LINE.fullmatch(ln)) and m["method"] == "HEAD"]
        if len(lines) >= before + 5 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(lines) == before + 5
    assert all(m["path"] == URL and m["status"] == "200" and m["bytes"] == "0" for m in lines[-5:])
