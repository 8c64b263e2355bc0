"""Staging inside the upstream's quota: `frt-mirror stage` (the command, in a child process) against a fake
Hub with fixed-window rate limits (RateLimit on every answer, 429 past the quota), beside the same stage
without a quota. Printed per case and bucket: the requests the stage needs (the distinct answers of the
run without a quota), the requests it sent under the quota, its 429s, and its wall against the quota's
floor: ceil(needed / quota) windows of the tightest bucket, plus the run without a quota.

    python -m bench.quota [--quick]

Cases (issue 43): 8 api requests per 10 s on the two-kernel manifest a user met (tests/support/quota.py:
9 + 2 revisions, listings of 4 pages); 100 per 10 s (the Hub's 500 per 300 s, scaled) on 50 kernels x 10
revisions. --quick: 2 s windows and 10 kernels x 5 revisions, for the smoke test.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DELAY_S = 0.02  # before every answer: a far Hub
TARGET = "torch2.13-cpu-x86_64-linux"
TOLERANCE = 1.15
HEAD = f'[[targets]]\ntarget = "{TARGET}"\n\n[kernels]\n'


@dataclass(frozen=True)
class Case:
    label: str
    api: int
    resolvers: int
    window: int
    repos: list
    manifest: Callable[[Path], str]  # writes the manifest at a path (or not), gives its text


def user_case(window: int) -> Case:
    from tests.support.quota import quota_manifest, quota_repos

    repos, pins = quota_repos()
    return Case(
        f"2 kernels (9 + 2 revisions), 8 / {window} s",
        8,
        3000,
        window,
        repos,
        lambda path: quota_manifest(path, pins, TARGET).read_text(),
    )


def fleet_case(kernels: int, revisions: int, window: int) -> Case:
    """`kernels` kernels of `revisions` commits each on v1 (three variants: the x86 CPU build, a CUDA one,
    torch-cpu), under the Hub's anonymous quotas scaled to the window: api 100, resolvers 600."""
    from tests.support.fakehub import FakeRepo
    from tests.support.kernel_fixtures import X86_CPU, X86_CU, build

    repos = []
    for k in range(kernels):
        repo = FakeRepo(f"fleet-org/kernel-{k:02d}")
        for i in range(revisions):
            repo.commit(
                build(f"k{k}", [X86_CPU, X86_CU, "torch-cpu"], version=1, note=f"{i}"), title=f"build {i}", branch="v1"
            )
        repo.branch("main", "v1")
        repos.append(repo)
    text = HEAD + "".join(f'"{r.repo_id}" = {{ version = 1 }}\n' for r in repos)
    return Case(f"{kernels} kernels x {revisions} revisions, 100 / {window} s", 100, 600, window, repos, lambda _: text)


@dataclass
class Run:
    wall: float
    by_bucket: dict[str, int]  # requests sent (429s included)
    answers: dict[str, int]  # distinct answers
    refused: dict[str, int]  # 429s
    waits: int  # "waiting" lines


def stage(case: Case, limited: bool, tmp: Path) -> Run:
    from tests.support.fakehub import FakeHub
    from tests.support.fakehub.ratelimit import RateLimits

    limits = RateLimits(api=case.api, resolvers=case.resolvers, window=case.window) if limited else None
    hub = FakeHub(
        case.repos, trusted_orgs=[r.repo_id.split("/")[0] for r in case.repos], page_size=5, rate_limits=limits
    )
    hub.start()
    hub.faults.delay("", DELAY_S)
    home = Path(tempfile.mkdtemp(dir=tmp))
    manifest = home.with_suffix(".toml")
    manifest.write_text(case.manifest(manifest))
    exe = str(Path(sys.executable).with_name("frt-mirror"))
    try:
        t0 = time.perf_counter()
        p = subprocess.run(
            [exe, "--home", str(home), "--endpoint", hub.url, "stage", str(manifest)],
            capture_output=True,
            text=True,
            env={**_env(), "HF_HUB_DISABLE_XET": "1"},
            timeout=1800,
        )
        wall = time.perf_counter() - t0
        log = hub.requests
    finally:
        hub.stop()
    if p.returncode:
        sys.exit(f"stage failed ({case.label}, limited={limited}):\n{p.stderr[-3000:]}")
    run = Run(wall, {"api": 0, "resolvers": 0}, {}, {"api": 0, "resolvers": 0}, 0)
    seen: dict[str, set] = {"api": set(), "resolvers": set()}
    for method, path, status in log:
        bucket = "resolvers" if "/resolve/" in path or path.startswith("/api/resolve-cache/") else "api"
        run.by_bucket[bucket] += 1
        run.refused[bucket] += status == 429
        if status != 429:
            seen[bucket].add((method, path))
    run.answers = {b: len(s) for b, s in seen.items()}
    run.waits = sum(ln.startswith("frt-mirror: waiting ") for ln in p.stderr.splitlines())
    return run


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith(("FRT_", "HF_"))}


def report(case: Case, free: Run, paced: Run) -> bool:
    quota = {"api": case.api, "resolvers": case.resolvers}
    windows = max(math.ceil(free.answers[b] / quota[b]) for b in quota)
    floor = windows * case.window + free.wall
    ratio = paced.wall / floor
    ok = ratio <= TOLERANCE and all(paced.by_bucket[b] == free.answers[b] + paced.refused[b] for b in quota)
    for i, b in enumerate(("api", "resolvers")):
        label = case.label if i == 0 else ""
        verdict = f"(<= {TOLERANCE}: {'PASS' if ok else 'FAIL'})"
        tail = f"{windows:>8} {floor:>8.1f} {paced.wall:>8.1f} {ratio:>10.2f}  {verdict}" if i == 0 else ""
        print(
            f"{label:38} {b:>9} {quota[b]:>6} {free.answers[b]:>7} {paced.by_bucket[b]:>6} {paced.refused[b]:>5} {tail}"
        )
    print(
        f"{'':38} without a quota {free.wall:.1f} s; {paced.waits} wait line(s); "
        f"requests sent = needed + one per 429: {'yes' if ok or ratio > TOLERANCE else 'NO'}"
    )
    return ok


def main(quick: bool = False) -> None:
    window = 2 if quick else 10
    cases = [user_case(window), fleet_case(10, 5, window) if quick else fleet_case(50, 10, window)]
    print(
        "stage inside the upstream's quota: fixed windows per bucket, RateLimit on every answer, 429 past the quota;\n"
        f"  frt-mirror stage (8 jobs) for {TARGET}, {DELAY_S * 1000:.0f} ms before every answer, listings paged by "
        "5 entries; needed = the distinct "
        "answers of the same stage without a quota;\n  floor = ceil(needed / quota) windows of the tightest bucket "
        "+ the stage without a quota"
    )
    print(
        f"\n{'':38} {'bucket':>9} {'quota':>6} {'needed':>7} {'sent':>6} {'429s':>5} "
        f"{'windows':>8} {'floor s':>8} {'wall s':>8} {'wall/floor':>10}"
    )
    with tempfile.TemporaryDirectory(prefix="frt-bench-quota-") as tmp:
        for case in cases:
            free = stage(case, False, Path(tmp))
            paced = stage(case, True, Path(tmp))
            report(case, free, paced)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m bench.quota", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 s windows and a smaller fleet (< 40 s), for tests")
    main(ap.parse_args().quick)
