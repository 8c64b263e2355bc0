"""A whole-file GET of a file serve verified lately is sent by serve's HTTP protocol itself with sendfile(2)
(sendfile.hot_get, limits.guarded, mirror/serve/sendfile.py): no byte of it through Python. Its answer
must be, byte for byte but the Date, what the app answers; logged and counted as any; pipelined requests
behind it answered in order; a file that changes while it is sent cut short before its tail (Content-Length
not reached); a client that goes away costs nothing else; and what it declines (the first GET, which
hashes the file; HTTP/1.0; a Range; a condition) goes through the app as before.

That the bytes went by sendfile is seen from inside serve: a sitecustomize on its PYTHONPATH (the test's
own, nothing of the product) counts the bytes os.sendfile sent into a file."""

from __future__ import annotations

import os
import re
import socket
import time
from pathlib import Path

import pytest

from tests.support.kernel_fixtures import ACTIVATION
from tests.support.serve_helpers import LINE, raw_http, raw_request, replica_env, serving
from tests.support.serve_home import BIG, BIG_FILE, BIG_SIZE, SO

pytestmark = pytest.mark.hub1

URL = f"/kernels/{ACTIVATION}/resolve/v1/{SO}"
BIG_URL = f"/kernels/{BIG}/resolve/v1/{BIG_FILE}"
COUNTER = """
import os
_sendfile, _log = os.sendfile, os.environ["FRT_TEST_SENDFILE_LOG"]
def sendfile(out, fd, offset, count):
    n = _sendfile(out, fd, offset, count)
    with open(_log, "a") as f:
        f.write(f"{n}\\n")
    return n
os.sendfile = sendfile
"""


def get(path: str = URL, *headers: str, version: str = "1.1") -> bytes:
    return "\r\n".join([f"GET {path} HTTP/{version}", "Host: x", *headers, "", ""]).encode()


def exchange(port: int, request: bytes, n: int = 1) -> list[tuple[bytes, bytes]]:
    """Send `request` (one or several pipelined) on one connection; the first `n` answers, (head, body)."""
    out: list[tuple[bytes, bytes]] = []
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(request)
        data = b""
        while len(out) < n:
            while b"\r\n\r\n" not in data:
                chunk = s.recv(1 << 20)
                assert chunk, (out, data)
                data += chunk
            head, _, data = data.partition(b"\r\n\r\n")
            length = int(re.search(rb"(?i)content-length: (\d+)", head)[1])
            while len(data) < length:
                chunk = s.recv(1 << 20)
                assert chunk, (head, len(data), length)
                data += chunk
            out.append((head + b"\r\n\r\n", data[:length]))
            data = data[length:]
    return out


def undated(head: bytes) -> bytes:
    return re.sub(rb"\r\ndate: [^\r]*", b"", head)


class Counted:
    def __init__(self, path: Path):
        self.path = path

    def sent(self) -> int:
        return sum(int(x) for x in self.path.read_text().split()) if self.path.exists() else 0

    def settled(self) -> int:
        """sent(), once no answer is adding to it: a client has its last byte before serve's counter
        (written after each sendfile returns) has that call's count."""
        last = self.sent()
        while True:
            time.sleep(0.2)
            if (now := self.sent()) == last:
                return now
            last = now


@pytest.fixture(scope="module")
def counted(serve_staged, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sendfile")
    (tmp / "sitecustomize.py").write_text(COUNTER)
    env = replica_env(PYTHONPATH=str(tmp), FRT_TEST_SENDFILE_LOG=str(tmp / "sent"))
    with serving(serve_staged.home, "--access-log", str(tmp / "access.log"), env=env) as served:
        yield served, Counted(tmp / "sent"), tmp / "access.log"


def body_of(serve_staged, repo: str, path: str) -> bytes:
    r = serve_staged.repos[repo]
    return r.commits[r.branches["v1"]].files[path]


def test_a_repeated_get_is_sent_by_sendfile_as_the_app_answers_it(counted, serve_staged):
    served, sendfile, _ = counted
    want = body_of(serve_staged, ACTIVATION, SO)
    ((slow_head, slow_body),) = exchange(served.port, get(URL, "Connection: close"))  # declined: the app
    before = sendfile.settled()
    first, second = exchange(served.port, get() + get(), 2)  # the first may hash it; the second is hot
    assert slow_body == first[1] == second[1] == want
    assert undated(second[0]) == undated(first[0]) == undated(slow_head).replace(b"connection: close\r\n", b"")
    assert sendfile.settled() - before >= len(want), "the repeated GET's bytes went by sendfile"


def test_a_big_file_and_pipelined_requests_behind_it(counted, serve_staged):
    served, sendfile, _ = counted
    big = body_of(serve_staged, BIG, BIG_FILE)
    exchange(served.port, get(BIG_URL))  # verified (hashed as the app sends it)
    before = sendfile.settled()
    api = f"GET /api/kernels/{ACTIVATION}/revision/v1 HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    answers = exchange(served.port, get(BIG_URL) + api + get(BIG_URL) + get(URL), 4)
    assert [a[1] for a in answers[::2]] == [big, big]
    assert b"application/json" in answers[1][0] and b'"sha"' in answers[1][1]
    assert answers[3][1] == body_of(serve_staged, ACTIVATION, SO)
    # The first by sendfile; those queued behind an answer in flight go through the app, in order.
    assert sendfile.settled() - before >= BIG_SIZE
    assert raw_http(served.port, raw_request("HEAD", URL))[0] == 200


def test_a_file_that_changes_while_it_is_sent_is_cut_before_its_tail(counted, serve_staged):
    """The blob's inode changes (here: its mode, so its ctime) while the client is slow to read: the
    check before the last TAIL bytes fails, and the connection closes short of Content-Length. The
    next GET hashes it again through the app (the bytes are the same): whole."""
    served, sendfile, _ = counted
    big = body_of(serve_staged, BIG, BIG_FILE)
    exchange(served.port, get(BIG_URL))
    exchange(served.port, get(BIG_URL))  # verified lately: the next is sent by sendfile
    blob = next(p for p in (serve_staged.home / "store" / "sha256").rglob("*") if p.stat().st_size == BIG_SIZE)
    before = sendfile.settled()
    with socket.create_connection(("127.0.0.1", served.port), timeout=30) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        s.sendall(get(BIG_URL))
        time.sleep(0.5)  # serve fills the socket's buffers and waits
        mode = blob.stat().st_mode
        os.chmod(blob, mode | 0o200)
        os.chmod(blob, mode)
        got = b""
        while chunk := s.recv(1 << 20):
            got += chunk
    body = got.partition(b"\r\n\r\n")[2]
    assert len(body) < BIG_SIZE and big.startswith(body), len(body)
    assert sendfile.settled() - before == BIG_SIZE - (64 << 10)  # all but the tail, then the check failed
    assert exchange(served.port, get(BIG_URL))[0][1] == big


def test_a_client_that_goes_away_mid_body_costs_nothing_else(counted, serve_staged):
    served, _, _ = counted
    exchange(served.port, get(BIG_URL))
    for _ in range(5):
        with socket.create_connection(("127.0.0.1", served.port), timeout=30) as s:
            s.sendall(get(BIG_URL))
            assert s.recv(1 << 16)
    assert exchange(served.port, get(BIG_URL))[0][1] == body_of(serve_staged, BIG, BIG_FILE)
    assert served.proc.poll() is None and "Traceback" not in served.stderr(), served.stderr()[-2000:]


def test_what_it_declines_goes_through_the_app(counted, serve_staged):
    served, sendfile, _ = counted
    want = body_of(serve_staged, ACTIVATION, SO)
    exchange(served.port, get())
    before = sendfile.settled()
    for request, body in [
        (get(URL, version="1.0"), want),
        (get(URL, "Range: bytes=10-19"), want[10:20]),
        (get(URL + "?x=1"), want),
        (get(URL, 'If-None-Match: "nope"'), want),
    ]:
        assert exchange(served.port, request)[0][1] == body, request
    assert sendfile.settled() == before


def test_each_sendfile_answer_is_logged_with_its_bytes(counted, serve_staged):
    served, _, log = counted
    want = body_of(serve_staged, ACTIVATION, SO)
    exchange(served.port, get())
    tagged = get(URL)  # the same URL: the hot table is keyed by it
    time.sleep(0.3)
    n0 = len(log.read_text().splitlines())
    exchange(served.port, tagged * 3, 3)
    deadline = time.monotonic() + 10
    while len(lines := log.read_text().splitlines()[n0:]) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    got = [m for ln in lines if (m := LINE.fullmatch(ln))]
    assert [(m["method"], m["status"], int(m["bytes"])) for m in got] == [("GET", "200", len(want))] * 3
