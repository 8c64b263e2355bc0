"""tinyadd, the repo the fake Hub is checked with (tests/test_fakehub.py, and over the real Hub's redirects
and rate limits in tests/test_fakehub_transport.py): a universal kernel whose v1 history is more than one
page, a foreign CUDA variant, a slash branch, a tag and an LFS file; the real `kernels` loading it; and a
stop of the fake Hub while it sends a body."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.support.fakehub import FakeHub, FakeRepo, git_blob_oid

ORG, NAME = "fixture-org", "tinyadd"
REPO_ID = f"{ORG}/{NAME}"
UNIV = "build/torch-universal"
CUDA = "build/torch211-cxx11-cu130-x86_64-linux"
BIG = bytes(range(256)) * 400  # 100 KiB > the 64 KiB LFS threshold
PAGE = 5


def universal_files(version: int) -> dict[str, bytes]:
    init = f"VERSION = {version}\n\n\ndef add(a, b):\n    return a + b\n"
    meta = {
        "id": f"_{NAME}_univ_{git_blob_oid(init.encode())[:7]}",
        "name": NAME,
        "version": version,
        "license": "apache-2.0",
        "python-depends": [],
        "backend": {"type": "cpu"},  # a universal build still declares a real backend type
    }
    return {f"{UNIV}/__init__.py": init.encode(), f"{UNIV}/metadata.json": json.dumps(meta).encode()}


def build_repo() -> tuple[FakeRepo, dict[str, str]]:
    """main → v1 (8 commits: more than one page) → v2; release/v1 mid-way; tag v1.0 at v1."""
    r = FakeRepo(REPO_ID, "kernel")
    shas = {
        "root": r.commit({"README.md": b"# tinyadd\n", ".gitattributes": b"*.bin filter=lfs\n"}, title="initial commit")
    }
    r.branch("v1", "main")
    r.commit(universal_files(1), title="add universal build", branch="v1")
    shas["cuda"] = r.commit(
        {
            f"{CUDA}/__init__.py": b"raise ImportError('foreign')\n",
            f"{CUDA}/_ops.py": b"",
            f"{CUDA}/metadata.json": b"{}",
        },
        title="add cuda variant",
        branch="v1",
    )
    r.branch("release/v1", "v1")
    r.commit({"weights.bin": BIG}, title="add weights", branch="v1")
    for i in range(4):
        r.commit({"README.md": f"# tinyadd\nrev {i}\n".encode()}, title=f"docs {i}", branch="v1", message=f"body {i}")
    shas["v1"] = r.tag("v1.0", "v1")
    r.branch("v2", "v1")
    shas["v2"] = r.commit({**universal_files(2), f"{CUDA}/": None}, title="v2", branch="v2")
    return r, shas


def run_get_kernel(hub: FakeHub, home: Path) -> subprocess.CompletedProcess:
    script = textwrap.dedent(f"""
        import kernels
        k = kernels.get_kernel({REPO_ID!r}, version=1)
        print("RESULT", k.VERSION, k.add(2, 3))
        assert k.VERSION == 1 and k.add(2, 3) == 5
    """)
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(home), "HF_HUB_DISABLE_XET": "1"}
    for var in ("HF_TOKEN", "HF_HUB_OFFLINE", "LOCAL_KERNELS", "HF_HUB_DISABLE_TELEMETRY"):
        env.pop(var, None)  # each would change what kernels asks the hub
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)


def stop_mid_body(hub: FakeHub, url: str) -> None:
    """GET `url` (weights.bin, off the Hub or its CDN) throttled to ~5 s of body, and stop the fake Hub
    while the body is in flight: the client must see the body cut, as a dead host's would be."""
    hub.faults.throttle("weights.bin", 20_000)  # 100 KiB at 20 kB/s: ~5 s of body
    u = urlsplit(url)
    busy = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    busy.request("GET", u.path + (f"?{u.query}" if u.query else ""))
    r = busy.getresponse()
    assert hub.wait_for_body(timeout=10)
    hub.stop()
    with pytest.raises((http.client.IncompleteRead, ConnectionError)):
        r.read()
