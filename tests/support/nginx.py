"""nginx in front of `frt-mirror serve --accel-redirect` replicas over one home, as `frt-mirror nginx-conf`
configures it. nginx is the real one (Debian's /usr/sbin/nginx; .ci/run installs it), run in the
foreground with its pid, logs and temp files in a temporary folder, and always stopped."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.cli import run_cli
from tests.support.serve_helpers import LINE, Served, free_port, raw_exchange, raw_http, raw_request, serving
from tests.support.serve_home import SO

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
PREFIX = "/_frt_store"
# Transport headers each server writes its own way: not what the mirror answers.
TRANSPORT = {"date", "server", "connection", "keep-alive"}


@dataclass
class Front:
    url: str
    port: int
    proc: subprocess.Popen
    run: Path  # nginx's pid, logs, temp files and its nginx.conf
    replicas: list[Served]

    def error_log(self) -> str:
        path = self.run / "error.log"
        return path.read_text(errors="replace") if path.exists() else ""


def nginx_conf(home: Path, ports: list[int], listen: int, run: Path, *extra: str, env: dict | None = None) -> str:
    args = ["nginx-conf", "--listen", f"127.0.0.1:{listen}", "--run-dir", str(run), *extra]
    for p in ports:
        args += ["--upstream", f"127.0.0.1:{p}"]
    if os.geteuid() == 0:  # nginx run by root hands its workers to `nobody`, who cannot enter pytest's tmp
        args += ["--user", "root"]
    p = run_cli(*args, home=home, env=env)
    assert p.returncode == 0, p.stderr
    return p.stdout


def nginx_t(conf: str, where: Path) -> subprocess.CompletedProcess:
    """nginx's own check (`nginx -t`) of `conf`, written into `where` (which holds its run dir)."""
    (where / "nginx.conf").write_text(conf)
    return subprocess.run(
        [NGINX, "-t", "-c", str(where / "nginx.conf"), "-e", str(where / "err.log")],
        capture_output=True,
        text=True,
        timeout=60,
    )


@contextlib.contextmanager
def nginx(conf: str, run: Path, replicas: list[Served], timeout: float = 30) -> Iterator[Front]:
    """Start nginx on `conf` in the foreground; yield once it answers through to a replica."""
    run.mkdir(parents=True, exist_ok=True)
    (run / "nginx.conf").write_text(conf)
    port = int(re.search(r"listen 127\.0\.0\.1:(\d+);", conf)[1])
    with open(run / "stderr", "wb") as err:
        proc = subprocess.Popen(
            [NGINX, "-c", str(run / "nginx.conf"), "-e", str(run / "error.log"), "-g", "daemon off;"],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    front = Front(f"http://127.0.0.1:{port}", port, proc, run, replicas)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"nginx exited {proc.returncode}: {(run / 'stderr').read_text()}{front.error_log()[-2000:]}"
                )
            with contextlib.suppress(OSError):
                # A replica's answer (404; 401 on a home with tokens), not nginx's own 502.
                if raw_http(port, raw_request("GET", "/api/agent-harnesses"), timeout=2)[0] in (401, 404):
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"nginx did not answer in time: {front.error_log()[-2000:]}")
            time.sleep(0.1)
        yield front
    finally:
        proc.terminate()  # SIGTERM: nginx's fast shutdown, workers included
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def front_of(
    home: Path,
    run: Path,
    n: int = 2,
    conf_args: tuple[str, ...] = (),
    serve_args: tuple[str, ...] = (),
    env: dict | None = None,
) -> Iterator[Front]:
    """n replicas of `serve --accel-redirect SERVE_ARGS` on one home, each logging to a file, and nginx
    in front (`nginx-conf ... CONF_ARGS`)."""
    run.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        replicas = [
            stack.enter_context(
                serving(
                    home, "--accel-redirect", PREFIX, "--access-log", str(run / f"replica{i}.log"), *serve_args, env=env
                )
            )
            for i in range(n)
        ]
        conf = nginx_conf(home, [r.port for r in replicas], free_port(), run, *conf_args)
        yield stack.enter_context(nginx(conf, run, replicas))


def replica_lines(front: Front) -> list[dict]:
    """Both replicas' access lines (lines go out at the next turn of a replica's loop: read after that)."""
    lines = []
    for i in range(len(front.replicas)):
        log = front.run / f"replica{i}.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        lines += [m.groupdict() for ln in text.splitlines() if (m := LINE.fullmatch(ln))]
    return lines


def wait_for_lines(front: Front, pred, n: int, timeout: float = 10) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        lines = [ln for ln in replica_lines(front) if pred(ln)]
        if len(lines) >= n or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


def answer(port: int, method: str, path: str, headers: list[str]):
    """(status, the headers but TRANSPORT as sorted (name, value) pairs, body): a header sent twice
    shows twice."""
    body = f"paths={SO}".encode() if method == "POST" else b""
    status, lines, data = raw_exchange(port, raw_request(method, path, *headers, body=body), timeout=30)
    pairs = sorted((k.strip().lower(), v.strip()) for k, _, v in (ln.partition(":") for ln in lines))
    return status, [(k, v) for k, v in pairs if k not in TRANSPORT], data
