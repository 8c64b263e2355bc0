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
from tests.support.serve_helpers import Served, free_port, raw_http, raw_request, serving

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
PREFIX = "/_frt_store"


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


def nginx_conf(home: Path, ports: list[int], listen: int, run: Path, *extra: str) -> str:
    args = ["nginx-conf", "--listen", f"127.0.0.1:{listen}", "--run-dir", str(run), *extra]
    for p in ports:
        args += ["--upstream", f"127.0.0.1:{p}"]
    if os.geteuid() == 0:  # nginx run by root hands its workers to `nobody`, who cannot enter pytest's tmp
        args += ["--user", "root"]
    p = run_cli(*args, home=home)
    assert p.returncode == 0, p.stderr
    return p.stdout


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
def front_of(home: Path, run: Path, n: int = 2, conf_args: tuple[str, ...] = ()) -> Iterator[Front]:
    """n replicas of `serve --accel-redirect` on one home, each logging to a file, and nginx in front
    (`nginx-conf ... CONF_ARGS`)."""
    run.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        replicas = [
            stack.enter_context(serving(home, "--accel-redirect", PREFIX, "--access-log", str(run / f"replica{i}.log")))
            for i in range(n)
        ]
        conf = nginx_conf(home, [r.port for r in replicas], free_port(), run, *conf_args)
        yield stack.enter_context(nginx(conf, run, replicas))
