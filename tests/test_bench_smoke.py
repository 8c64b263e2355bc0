"""The benchmarks still run (their figures are read by people, not asserted here)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def test_resolve_bench_runs_quick():
    p = subprocess.run([sys.executable, "-m", "bench.resolve", "--quick"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    for row in ("ledger (offline)", "live (ours, fresh ledger)", "live (kernels.get_kernel_variants)",
                "target: ledger p99 < 2 ms:"):
        assert row in p.stdout


def test_stage_bench_runs_quick():
    p = subprocess.run([sys.executable, "-m", "bench.stage", "--quick"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    for row in ("baseline (snapshot_download)", "ours (8 jobs, fresh home)", "ours rerun (same home)",
                "wall-time ratio ours/baseline =", "bytes fetched / needed =", "store dedup ratio ="):
        assert row in p.stdout


def test_serve_bench_runs_quick():
    p = subprocess.run([sys.executable, "-m", "bench.serve", "--quick"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    for row in ("hf_hub_download into a fresh cache", "\nserve ", "\nnginx ", "throughput ratio serve/nginx =",
                "HEAD latency,", "serve HEAD p99 ="):
        assert row in p.stdout


def test_seats_bench_runs_quick():
    p = subprocess.run([sys.executable, "-m", "bench.seats", "--quick"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    for row in ("seats: [frt.seats] 145 seats (5 head slabs), 0 refused", "plain load", "attach, warm",
                "target: attach of >= 144 seats < 0.5 s:", "seat/direct"):
        assert row in p.stdout
