"""The soak (bench/soak.py) for 2 minutes, as CI runs it: 64 clients through nginx over two replicas on
one PostgreSQL ledger with pull-through on, while the ledger stops, a replica is SIGKILLed and another
SIGTERMed and started again by a supervisor that waits for readiness, and the upstream answers 429 for a
window. Every answer is checked: 0 failed requests, 0 wrong bytes, and each replica process's RSS, fds
and threads flat within its life (the bench's own targets). The 10-minute run's output is in
docs/benchmarks.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_two_minutes_under_faults_lose_nothing():
    p = subprocess.run(
        [sys.executable, "-m", "bench.soak", "--minutes", "2", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode in (0, 1), p.stderr[-3000:]
    r = json.loads(p.stdout)
    said = "\n".join(r["faults"])
    assert "ledger down" in said and "SIGKILL" in said and "SIGTERM" in said and "quota on" in said, said
    assert r["requests"] > 10_000, r["requests"]
    assert (r["failed"], r["wrong"]) == (0, 0), r["examples"]
    assert [rep["restarts"] for rep in r["replicas"]] == [1, 1], r["replicas"]
    assert r["ok"], r["growth"]
