"""`frt-mirror serve`'s operator surface, through the real CLI in a subprocess: the access log
(`--access-log FILE|-`, default stderr), the warning for an empty home, and a busy port (one line,
exit 2, nothing served or said before it)."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.cli import cli_env
from tests.support.homes import empty_home
from tests.support.kernel_fixtures import ACTIVATION
from tests.support.serve_helpers import LINE, free_port, raw_http, raw_request, serving
from tests.support.serve_home import SO

SERVE = str(Path(sys.executable).with_name("frt-mirror"))


@pytest.fixture(scope="module")
def ledger_backend():
    """SQLite only here: test_serve runs the serve answers on PostgreSQL too."""
    yield None


PROBE = "/api/agent-harnesses"  # what serving() asks until serve answers


def access_lines(read, n: int, timeout: float = 10) -> list[dict]:
    """The access lines in `read()` but serving()'s probes, once there are `n` (lines go out at the next
    turn of serve's loop)."""
    deadline = time.monotonic() + timeout
    while True:
        lines = [m.groupdict() for ln in read().splitlines() if (m := LINE.fullmatch(ln)) and m["path"] != PROBE]
        if len(lines) >= n or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


def test_access_log_to_a_file(serve_staged, tmp_path):
    log = tmp_path / "logs" / "access.log"
    log.parent.mkdir()
    log.write_text("an earlier line\n")  # appended to, never truncated
    so = f"/kernels/{ACTIVATION}/resolve/refs%2Fheads%2Fv1/{SO}"
    act = serve_staged.repos[ACTIVATION]
    size = len(act.commits[act.branches["v1"]].files[SO])
    requests = [  # (method, raw path, extra headers, status, body bytes; None: whatever the body was)
        ("HEAD", so, [], 200, 0),
        ("HEAD", so, [], 200, 0),  # the second one is answered by the hot path: logged the same
        ("GET", so, [], 200, size),
        ("GET", so, ["Range: bytes=10-19"], 206, 10),
        ("GET", f"/api/kernels/{ACTIVATION}/tree/refs%2Fheads%2Fv1/build?recursive=true&expand=false", [], 200, None),
        ("GET", f"/api/kernels/{ACTIVATION}/revision/refs%2Fpr%2F1", [], 404, None),
        ("GET", '/api/kernels/a"b/c\\d', [], 404, None),  # a quote or backslash cannot break a field
        ("DELETE", "/kernels/x/y/resolve/main/f", [], 404, None),
    ]
    with serving(serve_staged.home, "--access-log", str(log)) as m:
        bodies = []
        for method, path, headers, _, _ in requests:
            bodies.append(raw_http(m.port, raw_request(method, path, *headers))[2])
        lines = access_lines(log.read_text, len(requests))
        stderr = m.stderr()
    assert log.read_text().startswith("an earlier line\n")
    assert len(lines) == len(requests), log.read_text()
    for line, (method, path, _, status, nbytes), body in zip(lines, requests, bodies, strict=False):
        want_path = path.replace('"', "\\x22").replace("\\d", "\\x5cd")
        assert (line["method"], line["path"], int(line["status"])) == (method, want_path, status), line
        assert int(line["bytes"]) == (len(body) if nbytes is None else nbytes), (line, len(body))
        assert line["client"] == "127.0.0.1" and float(line["ms"]) > 0
    assert not LINE.search(stderr)  # with a file, nothing of it on stderr


def test_access_log_default_is_stderr_and_dash_is_stdout(serve_staged):
    path = f"/api/kernels/{ACTIVATION}/refs"
    with serving(serve_staged.home) as m:
        raw_http(m.port, raw_request("GET", path))
        assert [ln["path"] for ln in access_lines(m.stderr, 1)] == [path]
        assert m.stderr().splitlines()[0].startswith("frt-mirror: serving ")
        assert m.stdout() == ""
    with serving(serve_staged.home, "--access-log", "-") as m:
        raw_http(m.port, raw_request("GET", path))
        assert [ln["path"] for ln in access_lines(m.stdout, 1)] == [path]
        assert not LINE.search(m.stderr())


def test_access_log_that_cannot_be_opened(serve_staged, tmp_path):
    p = run_serve(serve_staged.home, free_port(), "--access-log", str(tmp_path / "no" / "such" / "dir" / "a.log"))
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.splitlines() == [
        f"frt-mirror: cannot open the access log {tmp_path}/no/such/dir/a.log: No such file or directory"
    ]


def test_empty_home_warns_once(serve_staged, tmp_path):
    with serving(empty_home(tmp_path / "empty")) as m:  # a home, nothing staged in it yet
        status, headers, _ = raw_http(m.port, raw_request("GET", f"/api/kernels/{ACTIVATION}/refs"))
        first, second = m.stderr().splitlines()[:2]
    assert (status, headers.get("x-error-code")) == (404, "RepoNotFound")
    assert first == (
        f"frt-mirror: warning: nothing is staged in {tmp_path / 'empty'}: every repo will be "
        "answered RepoNotFound (stage first: frt-mirror stage MANIFEST)"
    )
    assert second.startswith("frt-mirror: serving ")
    with serving(serve_staged.home) as m:
        assert "warning" not in m.stderr()


def run_serve(home: Path, port: int, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [SERVE, "--home", str(home), "serve", "--port", str(port), *args],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=60,
    )


def test_busy_port_is_one_line_and_exit_2(serve_staged, tmp_path):
    with serving(serve_staged.home) as m:  # another serve holds the port
        p = run_serve(serve_staged.home, m.port)
        assert m.proc.poll() is None  # and keeps it
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.splitlines() == [
        f"frt-mirror: port {m.port} on 127.0.0.1 is in use (another frt-mirror serve? choose another with --port)"
    ]
    with socket.socket() as other:  # any program listening there
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        p = run_serve(empty_home(tmp_path / "empty"), port)  # the busy port wins over the empty home's warning
    assert p.returncode == 2 and len(p.stderr.splitlines()) == 1 and "is in use" in p.stderr
    p = run_serve(serve_staged.home, free_port(), "--host", "no-such-host.invalid")
    assert p.returncode == 2 and len(p.stderr.splitlines()) == 1 and "cannot listen on no-such-host" in p.stderr


def test_an_idle_keep_alive_connection_is_kept_as_long_as_a_client_may_leave_it(serve_staged):
    """A client's pool reuses a connection it left idle between a HEAD and a GET; 64 clients on a busy
    box leave it for seconds. uvicorn's default closes it after 5 s idle, and a GET sent as it closed
    failed in bench/pull_through.py: httpx's RemoteProtocolError('Server disconnected without sending a
    response'). nginx keeps one 75 s; serve does the same."""
    request = raw_request("GET", f"/api/kernels/{ACTIVATION}/refs").replace(
        b"Connection: close", b"Connection: keep-alive"
    )

    def exchange(s: socket.socket) -> bytes:
        """Send the request on the open connection; the answer's head, or b"" when serve closed it."""
        s.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            if not (chunk := s.recv(65536)):
                return b""
            data += chunk
        head, body = data.split(b"\r\n\r\n", 1)
        length = int(re.search(rb"content-length: (\d+)", head.lower()).group(1))
        while len(body) < length and (chunk := s.recv(65536)):
            body += chunk
        return head

    with serving(serve_staged.home) as m, socket.create_connection(("127.0.0.1", m.port), timeout=30) as s:
        assert exchange(s).startswith(b"HTTP/1.1 200")
        time.sleep(6.5)  # past uvicorn's default keep-alive timeout (5 s)
        assert exchange(s).startswith(b"HTTP/1.1 200"), "serve closed an idle keep-alive connection after 6.5 s"
