"""serve says when it can answer, and not before: `--ready-file PATH` and systemd's NOTIFY_SOCKET.

A supervisor that takes an open port for "up" was wrong about serve: a replica started while the ledger
was down accepted connections for seconds, then exited 3. Now serve refuses connections until its catalog
is loaded (and, with --workers, every worker accepts), then writes the ready file and sends READY=1 to a
real unix datagram socket the test binds, as systemd would; SIGTERM sends STOPPING=1 and removes the file.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.cli import cli_env, run_cli_process
from tests.support.homes import empty_home
from tests.support.kernel_fixtures import ACTIVATION
from tests.support.serve_helpers import children, free_port, raw_http, raw_request, replica_env

EXE = str(Path(sys.executable).with_name("frt-mirror"))
API = f"/api/kernels/{ACTIVATION}/revision/v1"


def start_serve(home: Path, port: int, tmp: Path, *args: str, env: dict) -> subprocess.Popen:
    with open(tmp / "stderr", "ab") as err:
        return subprocess.Popen(
            [EXE, "--home", str(home), "serve", "--port", str(port), *args],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
        )


def get(port: int) -> int | None:
    """A GET's status; None where the connection was refused (an accepted one must be answered)."""
    try:
        return raw_http(port, raw_request("GET", API), timeout=30)[0]
    except ConnectionRefusedError:
        return None


def connect(port: int) -> bool:
    """Whether a connection to the port is accepted now (refused: False)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            return True
    except ConnectionRefusedError:
        return False


@contextlib.contextmanager
def notify_socket(path: str) -> socket.socket:
    """A unix datagram socket bound where NOTIFY_SOCKET will name it ('@name': the abstract namespace)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(b"\0" + path[1:].encode() if path.startswith("@") else path)
    s.settimeout(60)
    try:
        yield s
    finally:
        s.close()


def message(s: socket.socket) -> dict[str, str]:
    return dict(line.split("=", 1) for line in s.recv(4096).decode().splitlines())


@pytest.mark.parametrize("workers", [1, 2])
def test_ready_once_the_catalog_is_loaded_then_stopping_on_sigterm(serve_staged, tmp_path, workers):
    """Until the ready file appears, every connection is refused; when it does, holding `PID URL`, the
    first request is answered (no retry); READY=1 came with it (MAINPID: serve's own pid, the parent of
    the workers), then on SIGTERM STOPPING=1, the file removed, exit 0."""
    port, ready = free_port(), tmp_path / "run" / "ready"
    ready.parent.mkdir()
    stale = "4242 http://stale\n"
    ready.write_text(stale)  # left by a serve killed with -9: must not say ready
    where = str(tmp_path / "notify") if workers == 1 else f"@frt-test-{os.getpid()}-{port}"
    with notify_socket(where) as sd:
        env = replica_env(NOTIFY_SOCKET=where)
        args = ["--ready-file", str(ready), "--workers", str(workers)]
        proc = start_serve(serve_staged.home, port, tmp_path, *args, env=env)
        try:
            absent, refused, deadline = 0, 0, time.monotonic() + 60
            while (said := ready.read_text() if ready.exists() else None) in (None, stale):
                assert proc.poll() is None, (tmp_path / "stderr").read_text()
                assert time.monotonic() < deadline, "no ready file"
                # Refused, or answered from the catalog (serve listens just before it writes the file).
                status = get(port)
                assert status in (None, 200), f"accepted a connection before it could answer: {status}"
                refused += status is None
                absent += said is None
                time.sleep(0.02)
            assert raw_http(port, raw_request("GET", API), timeout=10)[0] == 200
            assert said == f"{proc.pid} http://127.0.0.1:{port}\n"
            told = message(sd)
            assert told["READY"] == "1" and told["MAINPID"] == str(proc.pid), told
            assert told["STATUS"].startswith("serving ") and f"on http://127.0.0.1:{port}" in told["STATUS"]
            assert absent > 0 and refused > 0  # the stale file went first; the port refused while the catalog loaded
            if workers > 1:
                assert len(children(proc.pid)) == workers
            assert all(raw_http(port, raw_request("GET", API))[0] == 200 for _ in range(10))
            proc.send_signal(signal.SIGTERM)
            assert message(sd)["STOPPING"] == "1"
            assert proc.wait(timeout=60) == 0, (tmp_path / "stderr").read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert not ready.exists()
    assert "Traceback" not in (tmp_path / "stderr").read_text()


def test_ledger_down_at_start_accepts_no_connection_and_writes_no_ready_file(pg_server, pg_url, tmp_path):
    """A replica (re)started while its PostgreSQL ledger is stopped, with no catalog snapshot beside the home
    (test_serve_snapshot.py: with one, it serves): it exits 3 in one line that says so; all that time its
    port refuses connections, no ready file appears, and NOTIFY_SOCKET hears nothing."""
    home, port, ready = empty_home(tmp_path / "home"), free_port(), tmp_path / "ready"
    where = str(tmp_path / "notify")
    env = cli_env(FRT_LEDGER_URL=pg_url, NOTIFY_SOCKET=where)
    with notify_socket(where) as sd:
        pg_server.stop()
        try:
            proc = start_serve(home, port, tmp_path, "--ready-file", str(ready), env=env)
            tries = 0
            while proc.poll() is None:
                assert not connect(port), "a connection was accepted with no catalog to answer from"
                assert not ready.exists()
                tries += 1
                time.sleep(0.02)
            assert proc.wait(timeout=120) == 3
        finally:
            pg_server.start()
        sd.settimeout(0.5)
        with pytest.raises(TimeoutError):
            sd.recv(4096)
    lines = (tmp_path / "stderr").read_text().splitlines()
    assert len(lines) == 1 and "ledger" in lines[0] and "no catalog snapshot" in lines[0], lines
    assert tries > 10 and not ready.exists()


def test_an_unwritable_ready_file_is_one_line_and_exit_2(serve_staged, tmp_path):
    (tmp_path / "file").write_text("")
    for where, why in [(tmp_path / "file" / "ready", "Not a directory"), (tmp_path, "a folder")]:
        p = run_cli_process("serve", "--port", str(free_port()), "--ready-file", str(where), home=serve_staged.home)
        assert (p.returncode, p.stdout) == (2, ""), p.stderr
        assert p.stderr.splitlines() == [f"frt-mirror: --ready-file {where}: cannot write it ({why})"]
