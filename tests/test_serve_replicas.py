"""Stateless replicas: several `serve` processes over one home and one ledger (SQLite in the home, or a
PostgreSQL several hosts share) answer what a stager stages after they started, within about a second
(the ledger's change serial), and a token added after they started, within the tokens' 2 s; no restart."""

from __future__ import annotations

import json
import time

import pytest

from tests.support.cli import X86, run_cli, write_manifest
from tests.support.kernel_fixtures import ACTIVATION, RELU
from tests.support.serve_helpers import raw_http, raw_request, serving


def wait_for(check, timeout: float = 20.0) -> float:
    """Seconds until check() held (polled); fails past `timeout` (generous: a loaded 2-core machine)."""
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 > timeout:
            pytest.fail(f"not seen within {timeout} s")
        time.sleep(0.05)
    return time.monotonic() - t0


def status(port: int, path: str, *headers: str) -> int:
    return raw_http(port, raw_request("GET", path, *headers))[0]


def test_replicas_answer_what_is_staged_and_tokens_added_after_they_started(hub, tmp_path, ledger_each):
    home = tmp_path / "home"
    for repo in (RELU, ACTIVATION):
        write_manifest(tmp_path / f"{repo.split('/')[1]}.toml", {repo: {"version": 1}}, [X86])
    assert run_cli("--endpoint", hub.url, "stage", str(tmp_path / "relu.toml"), home=home).returncode == 0
    refs = f"/api/kernels/{ACTIVATION}/refs"
    # b forks two workers after loading: each must poll on its own (a fork copies no thread).
    with serving(home) as a, serving(home, "--workers", "2") as b:
        assert status(a.port, refs) == status(b.port, refs) == 404  # not staged yet
        p = run_cli("--endpoint", hub.url, "stage", str(tmp_path / "activation.toml"), home=home)
        assert p.returncode == 0, p.stderr
        for replica in (a, b):
            wait_for(lambda r=replica: all(status(r.port, refs) == 200 for _ in range(20)))  # either worker
            doc = json.loads(raw_http(replica.port, raw_request("GET", refs))[2])
            assert "v1" in [br["name"] for br in doc["branches"]]
        token = run_cli("token", "add", "site", home=home).stdout.strip()
        for replica in (a, b):
            wait_for(lambda r=replica: all(status(r.port, refs) == 401 for _ in range(20)))
            assert status(replica.port, refs, f"Authorization: Bearer {token}") == 200
        for replica in (a, b):
            assert replica.proc.poll() is None, replica.stderr()
