"""Helpers for the serve tests: `frt-mirror serve` as a subprocess (its access log's lines, a pull-through's
environment), real clients in subprocesses, a TCP proxy that can drop a download mid-body, a tripwire on
the stopped upstream's port, raw HTTP."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

RESULT = "RESULT "
# One line of serve's access log (--access-log FILE|-, default stderr).
LINE = re.compile(
    r"(?P<client>\S+) - - \[(?P<time>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)\] "
    r'"(?P<method>[A-Z]+) (?P<path>\S+) HTTP/1\.1" (?P<status>\d{3}) (?P<bytes>\d+) '
    r"(?P<ms>\d+\.\d{3})ms"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children(pid: int) -> list[int]:
    """serve's workers: the processes whose parent is `pid` (whichever of its threads started them)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
    return sorted(out)


@dataclass
class Served:
    url: str
    port: int
    proc: subprocess.Popen
    out: Path  # the process's stdout and stderr, as files: the access log goes to one of them, and a
    err: Path  # pipe nobody drains would fill after a few hundred lines and stall the server

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")


@contextlib.contextmanager
def serving(
    home: Path, *args: str, env: dict | None = None, timeout: float = 30, prefix: tuple[str, ...] = ()
) -> Iterator[Served]:
    """Run `frt-mirror --home HOME serve --port P ARGS` as a user would; yield once it answers HTTP.
    `prefix`: a command that execs the rest (tests/support/tmpfs.py: a mount namespace of its own)."""
    exe = str(Path(sys.executable).with_name("frt-mirror"))
    port = free_port()
    logs = Path(tempfile.mkdtemp(prefix="frt-serve-"))
    out, err = logs / "stdout", logs / "stderr"
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = subprocess.Popen(
            [*prefix, exe, "--home", str(home), "serve", "--port", str(port), *args],
            stdout=o,
            stderr=e,
            env=env or _base_env(),
        )
    served = Served(f"http://127.0.0.1:{port}", port, proc, out, err)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"serve exited {proc.returncode}: {served.stderr()[-2000:]}")
            try:
                status, _, _ = raw_http(port, raw_request("GET", "/api/agent-harnesses"), timeout=2)
                if status:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("serve did not answer in time")
            time.sleep(0.1)
        yield served
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(logs, ignore_errors=True)


def _base_env() -> dict[str, str]:
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("FRT_", "HF_", "LOCAL_KERNELS")) or k == "FRT_LEDGER_URL"
    } | {"PYTHONWARNINGS": "ignore"}


def replica_env(**extra: str) -> dict[str, str]:
    """A replica's environment as `serving` gives it (FRT_LEDGER_URL, the stager's ledger, kept), plus `extra`."""
    return _base_env() | extra


FAST = {"FRT_RETRY_ATTEMPTS": "2", "FRT_RETRY_BASE_WAIT": "0.05"}  # a pull-through's retries, brief


def serve_env(**extra: str) -> dict:
    """A pull-through serve's environment: nothing of ours or the Hub's from the caller's, FAST retries."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("FRT_", "HF_", "LOCAL_KERNELS"))}
    return {**base, "PYTHONWARNINGS": "ignore", **FAST, **extra}


def client_env(url: str, hf_home: Path, **extra: str) -> dict[str, str]:
    """What a cluster job sets to use the mirror: HF_ENDPOINT, Xet off, and a fresh HF_HOME."""
    return _base_env() | {
        "HF_ENDPOINT": url,
        "HF_HUB_DISABLE_XET": "1",
        "HF_HOME": str(hf_home),
        "HF_HUB_ETAG_TIMEOUT": "30",
        **extra,
    }


CLIENT_HASHES = """
def sha256_of(path):
    import hashlib
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()
def tree_sha256(root):
    import os
    return {os.path.relpath(os.path.join(d, n), root): sha256_of(os.path.join(d, n))
            for d, _, names in os.walk(root) for n in names}
"""


def run_client(code: str, url: str, hf_home: Path, timeout: float = 120, **extra: str):
    """Run unmodified client code in a subprocess (this interpreter, so this venv's huggingface_hub).
    The code reports with `report(obj)`, and may hash what it downloaded with `sha256_of(path)` and
    `tree_sha256(root)` ({relative path: sha256}); returns (CompletedProcess, the reported object or None)."""
    prelude = f"import json\ndef report(obj):\n    print({RESULT!r} + json.dumps(obj), flush=True)\n" + CLIENT_HASHES
    p = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=client_env(url, hf_home, **extra),
        timeout=timeout,
    )
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith(RESULT)]
    return p, (json.loads(lines[-1][len(RESULT) :]) if lines else None)


def raw_request(method: str, path: str, *headers: str, body: bytes = b"") -> bytes:
    """The bytes of one HTTP/1.1 request, exactly as given (the path is not normalized or quoted)."""
    lines = [f"{method} {path} HTTP/1.1", "Host: x", *headers, "Connection: close"]
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    return "\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + body


def raw_http(port: int, request: bytes, timeout: float = 10) -> tuple[int, dict[str, str], bytes]:
    """Send raw request bytes (nothing normalizes the path); read to EOF. (status, headers, body)."""
    status, lines, body = raw_exchange(port, request, timeout)
    return status, _headers(lines), body


def raw_exchange(port: int, request: bytes, timeout: float = 10) -> tuple[int, list[str], bytes]:
    """raw_http, with the response's header lines as they came (a header sent twice shows twice)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(1 << 16):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1]) if len(lines[0].split()) > 1 else 0
    return status, lines[1:], body


def _headers(lines: list[str]) -> dict[str, str]:
    return {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines)}


class Tripwire:
    """Listens where the stopped upstream was and records every connection: the mirror must never call."""

    def __init__(self, port: int):
        self.hits: list[bytes] = []
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(1)
                try:
                    self.hits.append(conn.recv(4096) or b"<connect>")
                except OSError:
                    self.hits.append(b"<connect>")

    def close(self):
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()


@contextlib.contextmanager
def tripwire_at(url: str) -> Iterator[Tripwire]:
    """A Tripwire on the port of the stopped upstream that answered at `url`, closed afterwards."""
    tripwire = Tripwire(int(url.rsplit(":", 1)[1]))
    try:
        yield tripwire
    finally:
        tripwire.close()


@dataclass
class Exchange:
    method: str
    path: str
    headers: dict[str, str]
    status: int | None = None
    response_headers: dict[str, str] = field(default_factory=dict)


class CuttingProxy:
    """A TCP proxy in front of serve that logs each request and response head, and closes the
    connection cleanly (FIN, so the client sees a short body) after `cut_after` body bytes of the
    first GET of `cut_path` that has no Range header. The client does not pipeline, so after a
    request goes upstream the next bytes from upstream are its response."""

    def __init__(self, upstream_port: int, cut_path: str, cut_after: int):
        self.upstream_port, self.cut_path, self.cut_after = upstream_port, cut_path, cut_after
        self.exchanges: list[Exchange] = []
        self.cuts = 0
        self._lock = threading.Lock()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(32)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._accept = threading.Thread(target=self._accept_loop, daemon=True)
        self._accept.start()

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _accept_loop(self):
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            conn = {"pending": None, "cut_at": None, "body": 0, "head": b"", "alive": 2}
            for target in (self._client_to_upstream, self._upstream_to_client):
                threading.Thread(target=target, args=(client, upstream, conn), daemon=True).start()

    def _done(self, client, upstream, conn, written):
        """One direction is over: a FIN to the side it wrote to (`written`); the last one closes both."""
        with contextlib.suppress(OSError):
            written.shutdown(socket.SHUT_WR)
        with self._lock:
            conn["alive"] -= 1
            last = conn["alive"] == 0
        if last:
            client.close()
            upstream.close()

    def _client_to_upstream(self, client, upstream, conn):
        buf = b""
        try:
            while data := client.recv(1 << 16):
                buf += data
                while b"\r\n\r\n" in buf:
                    head, _, rest = buf.partition(b"\r\n\r\n")
                    lines = head.decode("latin-1").split("\r\n")
                    method, path = lines[0].split()[:2]
                    headers = _headers(lines[1:])
                    length = int(headers.get("content-length", "0"))
                    while len(rest) < length and (more := client.recv(1 << 16)):
                        rest += more
                    ex = Exchange(method, path, headers)
                    with self._lock:
                        self.exchanges.append(ex)
                        cut = method == "GET" and path == self.cut_path and "range" not in headers and not self.cuts
                        self.cuts += cut
                        conn.update(pending=ex, head=b"", body=0, cut_at=self.cut_after if cut else None)
                    upstream.sendall(head + b"\r\n\r\n" + rest[:length])
                    buf = rest[length:]
        except OSError:
            pass
        finally:
            self._done(client, upstream, conn, upstream)

    def _upstream_to_client(self, client, upstream, conn):
        try:
            while data := upstream.recv(1 << 16):
                ex, head_len = conn["pending"], 0
                if ex is not None and ex.status is None:
                    conn["head"] += data
                    end = conn["head"].find(b"\r\n\r\n")
                    if end < 0:
                        client.sendall(data)
                        continue
                    lines = conn["head"][:end].decode("latin-1").split("\r\n")
                    ex.response_headers = _headers(lines[1:])
                    ex.status = int(lines[0].split()[1])
                    head_len = len(data) - (len(conn["head"]) - end - 4)  # head bytes in this chunk
                body = len(data) - head_len
                cut = conn["cut_at"]
                if cut is not None and conn["body"] + body >= cut:
                    client.sendall(data[: head_len + cut - conn["body"]])
                    client.shutdown(socket.SHUT_WR)  # FIN mid-body: the client sees a short read
                    upstream.shutdown(socket.SHUT_RDWR)
                    return
                conn["body"] += body
                client.sendall(data)
        except OSError:
            pass
        finally:
            self._done(client, upstream, conn, client)


def read_response_head(s) -> tuple[int, dict[str, str], bytes]:
    """Read a response's status line and headers off a socket; (status, headers, body bytes read so far)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(1 << 16)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    return int(lines[0].split()[1]), _headers(lines[1:]), body


def read_held_stream(port: int, path: str, held: int, release) -> tuple[dict[str, str], bytes, int]:
    """GET `path` of a file the upstream holds after its first `held` bytes: read the answer until all
    but the last 2 MiB of those arrived (the mirror streams while it fetches), then `release()` the
    upstream and read to the end. (The headers, the body, the bytes read before the release.)"""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(raw_request("GET", path))
        status, headers, body = read_response_head(s)
        assert status == 200, headers
        while len(body) < held - (2 << 20):  # the upstream still holds the rest
            chunk = s.recv(1 << 20)
            assert chunk, len(body)
            body += chunk
        before = len(body)
        release()
        while chunk := s.recv(1 << 20):
            body += chunk
    return headers, body, before
