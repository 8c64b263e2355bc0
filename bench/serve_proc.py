"""A `frt-mirror serve` process for the pull-through benches, answering before it is handed back; and the
environment their huggingface_hub client children run in."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from bench.serve import free_port, wait_listening


def client_env() -> dict[str, str]:
    """No HF_* of the caller's; no Xet, no progress bars. Throughput is measured, not client timeouts: a cold
    HEAD waits for the upstream's listing, which on a loaded 2-core CI box once took longer than
    huggingface_hub's 10 s HEAD timeout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(
        HF_HUB_DISABLE_XET="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        HF_HUB_DOWNLOAD_TIMEOUT="120",
        HF_HUB_ETAG_TIMEOUT="120",
    )
    return env


def serve(home: Path, tmp: Path, *args: str) -> tuple[subprocess.Popen, str]:
    """`frt-mirror --home HOME serve --port P *args`, its log in TMP/serve-P.log; (the process, its URL)."""
    port = free_port()
    exe = str(Path(sys.executable).with_name("frt-mirror"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "FRT_"))}
    with open(tmp / f"serve-{port}.log", "wb") as log:
        proc = subprocess.Popen(
            [exe, "--home", str(home), "serve", "--port", str(port), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    wait_listening(port, proc, "frt-mirror serve")
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:  # the port is bound before the app is built: wait for an answer, not for a listener
        try:
            urllib.request.urlopen(f"{url}/api/agent-harnesses", timeout=5)
        except urllib.error.HTTPError:
            return proc, url
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"frt-mirror serve did not answer (exit {proc.poll()})")
            time.sleep(0.05)


def serve_logs(tmp: Path) -> str:
    """The head and tail of every serve log under `tmp`, for a bench that fails."""
    return "".join((t := p.read_text())[:2000] + "\n...\n" + t[-1000:] for p in tmp.glob("serve-*.log"))
