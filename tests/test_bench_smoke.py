"""The benchmarks still run (their figures are read by people, not asserted here)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support import ROOT

ROWS = {
    "resolve": (
        "ledger (offline)",
        "live (ours, fresh ledger)",
        "live (kernels.get_kernel_variants)",
        "target: ledger p99 < 2 ms:",
    ),
    "stage": (
        "baseline (snapshot_download)",
        "ours (8 jobs, fresh home)",
        "ours rerun (same home)",
        "ours, real-Hub transport",
        "same, quota met",
        "wall-time ratio ours/baseline =",
        "real-Hub transport wall / plain upstream's =",
        "bytes fetched / needed =",
        "store dedup ratio =",
        "stage inside the upstream's quota",
        "2 kernels (9 + 2 revisions), 8 / 2 s",
        "10 kernels x 5 revisions, 100 / 2 s",
    ),
    "serve": (
        "hf_hub_download into a fresh cache",
        "\nserve ",
        "\nnginx ",
        "throughput ratio serve/nginx =",
        "\nnginx + 2 replicas ",
        "\nsame + head cache ",
        "\nsame + head map ",
        "\nnginx, N workers ",
        "64 concurrent keep-alive clients, each HEAD + GET",
        "throughput ratio nginx + 2 replicas/nginx static at 64 clients =",
        "HEAD latency,",
        "throughput ratio serve alone/nginx static at 64 clients =",
        "serve alone HEAD p99 =",
        "HEAD p99 through nginx (nginx + 2 replicas) =",
        "HEAD p99 through nginx (same + head cache) =",
        "HEAD p99 through nginx (same + head map) =",
        "HEAD/s = ",
    ),
    "bundle": (
        "A: full, before v3",
        "incremental --since A",
        "full bundle, after v3",
        "bytes ratio incremental/full =",
        "import vs tar -x:",
        "tar -x+sync s",
        "\n10 MiB ",
        "\n128 MiB ",
        "throughput ratio import/(tar -x, then sync) =",
        "throughput ratio import/tar -x =",
        "floors, of the",
    ),
    "s3": (
        "\nfilesystem store, SQLite ",
        "\nfilesystem store ",
        "\nS3 store ",
        "\nS3 server's ingest alone ",
        "stage wall, S3 store / filesystem store =",
        "stage bytes, S3 store / filesystem store = 1.00 stored, 1.00 fetched",
        "serve at 64 clients, S3 store / filesystem store =",
    ),
    "pull_through": (
        "straight to the upstream",
        "through serve --upstream (cold)",
        "through serve --upstream (warm)",
        "staged serve (no upstream)",
        "upstream bytes / file size through the mirror =",
        "warm-hit throughput ratio pull-through/staged serve =",
        # its second part, bench/pull_cap.py (which exits 1 where a check fails)
        "pull-through under a cache cap: 160 requests",
        "\nuncapped ",
        "\n--cache-max 0.8 MiB ",
        "capped/uncapped, a cap of 1/3 of the working set: hit rate ",
        "checks: 0 failed ok, 0 wrong bytes ok, store <= cap ok, hit rate capped < uncapped ok",
    ),
    "seat_cost": (
        "where a seat's cost goes, beside its kernel's launch",
        "norm 1x1024 (float32, cpu)",
        "1 call",
        "6 guard",
        "  seat ",
        "the seat's own cost on this host",
    ),
    "seats": (
        "seats: [frt.seats] 145 seats (5 head slabs), 0 refused",
        "plain load",
        "attach, warm",
        "target: attach of >= 144 seats < 0.5 s:",
        "seat/direct",
    ),
}


@pytest.mark.parametrize("bench", sorted(ROWS))
def test_bench_runs_quick(bench):
    p = subprocess.run(
        [sys.executable, "-m", f"bench.{bench}", "--quick"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stderr
    for row in ROWS[bench]:
        assert row in p.stdout
