"""Resolve latency: answering from the ledger vs. asking upstream on every resolve.

    python -m bench.resolve [--quick] [--ledger URL]

Rows: `frt.resolver.resolve(..., offline=True)` against a ledger filled once by `scan`; ours
online on a fresh empty ledger (what a user without a ledger pays); and the `kernels` library's
own online variant selection, `kernels.get_kernel_variants(repo, version=N)`. With `--ledger URL` (a
PostgreSQL database, e.g. postgresql://postgres@127.0.0.1:5432/bench), the same offline calls also run
against a ledger there, scanned the same way, beside SQLite's.

The fake Hub runs in this process. Both live clients run in a child process: `kernels` reads
HF_ENDPOINT when it is imported (the child sets it before any import), and a client sharing the
GIL with the server would be slowed by it; a child each keeps the two live rows comparable.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from bench.child import run_child

# Variant names a repo draws 6-8 of (plus torch-universal in every third repo): wide enough that
# about a quarter of (repo, version, target) requests find no variant and are refused.
ARCH = [
    "torch211-cxx11-cu130-x86_64-linux",
    "torch212-cxx11-cu130-x86_64-linux",
    "torch212-cxx11-cu128-x86_64-linux",
    "torch210-cxx11-cu126-x86_64-linux",
    "torch213-cxx11-cpu-x86_64-linux",
    "torch212-cxx11-cpu-x86_64-linux",
    "torch211-cxx11-cu130-aarch64-linux",
    "torch211-cxx11-cu128-aarch64-linux",
    "torch213-cxx11-cpu-aarch64-linux",
    "torch-stable-abi211-cu130-x86_64-linux",
    "torch211-cxx11-rocm71-x86_64-linux",
    "torch210-cxx11-xpu20253-x86_64-linux",
    "tvm-ffi01-cu130-x86_64-linux",
    "torch-metal",
    "torch-cpu",
    "torch-cuda",
]
TARGETS = [
    "torch2.11-cu130-x86_64-linux",
    "torch2.12-cu130-x86_64-linux",
    "torch2.13-cpu-x86_64-linux",
    "torch2.11-cu130-aarch64-linux",
    "torch2.13-cpu-aarch64-linux",
    "torch2.11-rocm71-x86_64-linux",
]
SEED = 20260101
COMMITS = ((1, 3), (2, 2))  # (version, commits on branch v<version>)
ROOT = Path(__file__).resolve().parents[1]


def make_repos(n: int) -> list:
    """n repos with branches v1, v2 (COMMITS); every third has torch-universal, so never refuses."""
    from tests.support.fakehub import FakeRepo
    from tests.support.kernel_fixtures import build

    rng, repos = random.Random(SEED), []
    for i in range(n):
        name, repo = f"k{i:02d}", FakeRepo(f"bench-org/k{i:02d}")
        universal = ["torch-universal"] if i % 3 == 0 else []
        for version, commits in COMMITS:
            arch = rng.sample(ARCH, rng.randint(6, 8))
            for c in range(commits):  # older commits differ by one build: refusals walk real history
                names = arch if c == commits - 1 else arch[1:] + rng.sample(sorted(set(ARCH) - set(arch)), 1)
                repo.commit(
                    build(name, sorted(names + universal), version=version, note=f"c{c}"),
                    title=f"v{version} build {c}",
                    branch=f"v{version}",
                )
        repo.branch("main", "v2")
        repos.append(repo)
    return repos


def calls(repos: list, n: int, distinct: bool = False) -> list[tuple[str, str, int]]:
    """n (repo, target, version) calls cycling over every repo × target, versions mixed; with
    `distinct`, every repo × target × version once instead."""
    if distinct:
        return [(r.repo_id, t, v) for r in repos for t in TARGETS for v in (1, 2)]
    rng = random.Random(SEED + 1)
    combos = [(r.repo_id, t, rng.choice((1, 2))) for r in repos for t in TARGETS]
    rng.shuffle(combos)
    return [combos[i % len(combos)] for i in range(n)]


def timed(fn, work, warm_work) -> tuple[list[int], list[bool], list[int]]:
    """Nanoseconds per call and whether it resolved (False: KernelUnavailable), after the
    `warm_work` calls, whose times are returned apart, so imports, lru caches and connection
    setup are not charged to the measured calls."""
    from frt.resolver.resolution import KernelUnavailable

    times, ok, warm = [], [], []
    warmup = len(warm_work)
    for i, args in enumerate(list(warm_work) + list(work)):
        t0 = time.perf_counter_ns()
        try:
            fn(*args)
            good = True
        except KernelUnavailable:
            good = False
        dt = time.perf_counter_ns() - t0
        if i >= warmup:
            times.append(dt)
            ok.append(good)
        else:
            warm.append(dt)
    return times, ok, warm


def hub_env(url: str, home: str) -> None:
    """Point huggingface_hub (read at import time) at the fake Hub; call before importing it."""
    os.environ.update(HF_ENDPOINT=url, HF_HOME=home, HF_HUB_DISABLE_XET="1")
    for var in ("HF_TOKEN", "HF_HUB_OFFLINE", "LOCAL_KERNELS", "HF_HUB_DISABLE_TELEMETRY"):
        os.environ.pop(var, None)  # each would change what the clients ask, or break kernels


def live_child(client: str, url: str, work: list, warmup: int, home: str) -> None:
    """Runs in the child: one live client, timings as JSON on stdout."""
    hub_env(url, home)
    from frt.resolver.hub import HubClient
    from frt.resolver.ledger import Ledger
    from frt.resolver.resolve import resolve
    from frt.resolver.targets import parse_target

    if client == "kernels":
        import kernels

        def one(repo, _target, version):  # kernels selects for this host only; the cost is the wire
            kernels.get_kernel_variants(repo, version=version)
    else:
        hub = HubClient(url)

        def one(repo, target, version):
            resolve(repo, target=parse_target(target), ledger=fresh.pop(), version=version, hub=hub, offline=False)

        # Fresh ledgers are opened (schema created) before timing: the resolve is what is measured.
        fresh = [Ledger(Path(home) / f"fresh-{i}.db") for i in range(warmup + len(work))]
    times, ok, _ = timed(one, work, work[:warmup])
    json.dump({"times": times, "ok": ok}, sys.stdout)


def run_live(client: str, hub, work: list, warmup: int, home: str) -> tuple[list[int], list[bool], float]:
    hub.reset_log()
    job = {"work": work, "warmup": warmup, "home": home}
    res = run_child("bench.resolve", "--live-child", client, hub.url, job=job, timeout=300)
    return res["times"], res["ok"], len(hub.requests) / (warmup + len(work))


def stats(ns: list[int]) -> tuple[float, float, float]:
    """p50, p99 (nearest rank) and mean, in ms."""
    s = sorted(ns)
    rank = lambda q: s[max(0, math.ceil(q * len(s)) - 1)]  # noqa: E731
    return rank(0.50) / 1e6, rank(0.99) / 1e6, sum(s) / len(s) / 1e6


def server_ledger(url: str, repos: list, hub, n: int) -> list[tuple]:
    """The same scans and offline calls against a ledger on a server: rows for the table."""
    from frt.resolver.hub import HubClient
    from frt.resolver.ledger import Ledger
    from frt.resolver.resolve import resolve
    from frt.resolver.scan import scan
    from frt.resolver.targets import parse_target

    ledger = Ledger(url)
    try:
        for r in repos:
            scan(r.repo_id, hub=HubClient(hub.url), ledger=ledger)
        targets = {t: parse_target(t) for t in TARGETS}

        def offline(repo, target, version):
            resolve(repo, target=targets[target], ledger=ledger, version=version, offline=True)

        ts, ok, first = timed(offline, calls(repos, n), calls(repos, 0, distinct=True))
    finally:
        ledger.close()
    name = url.split(":", 1)[0].split("+")[0]
    return [(f"ledger on {name} (offline)", ts, None), (f"  {name}, first call per request", first, None)]


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.resolve", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smaller run (< 20 s), for tests")
    ap.add_argument("--ledger", metavar="URL", help="also time offline resolves from a ledger at URL (PostgreSQL)")
    ap.add_argument("--live-child", nargs=2, metavar=("CLIENT", "URL"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.live_child:
        job = json.load(sys.stdin)
        return live_child(*args.live_child, job["work"], job["warmup"], job["home"])

    n_repos, n_ledger, n_live, warm_live = (6, 200, 10, 3) if args.quick else (50, 1000, 100, 10)
    home_dir = tempfile.TemporaryDirectory(prefix="frt-bench-")
    hub_env("http://unused.invalid", home_dir.name)  # scans get the fake Hub's url explicitly
    from frt.resolver.hub import HubClient
    from frt.resolver.ledger import Ledger
    from frt.resolver.resolve import resolve
    from frt.resolver.scan import scan
    from frt.resolver.targets import parse_target
    from tests.support.fakehub import FakeHub

    repos = make_repos(n_repos)
    # One page per listing, as the real Hub gives for repos this small (the default 5 tests paging).
    hub = FakeHub(repos, page_size=1000)
    hub.start()
    with home_dir as home:
        ledger = Ledger(Path(home) / "ledger.db")
        t0 = time.perf_counter()
        for r in repos:
            scan(r.repo_id, hub=HubClient(hub.url), ledger=ledger)
        scan_s = time.perf_counter() - t0

        targets = {t: parse_target(t) for t in TARGETS}

        def offline(repo, target, version):
            resolve(repo, target=targets[target], ledger=ledger, version=version, offline=True)

        # Warm-up: every distinct (repo, target, version) once, timed apart as "first call": it pays
        # for the in-process caches (the variant decisions) that a long-running process keeps.
        led_t, led_ok, first_t = timed(offline, calls(repos, n_ledger), calls(repos, 0, distinct=True))
        refusals = sum(r.count for r in ledger.refusals())
        server_rows = server_ledger(args.ledger, repos, hub, n_ledger) if args.ledger else []
        live_work = calls(repos, n_live)
        ours_t, ours_ok, ours_req = run_live("ours", hub, live_work, warm_live, home)
        kern_t, _, kern_req = run_live("kernels", hub, live_work, warm_live, home)
        ledger.close()
    hub.stop()

    n_ok = sum(led_ok)
    n_commits = sum(c for _, c in COMMITS)
    print(
        f"resolve latency: {n_repos} repos x {len(TARGETS)} targets, {n_commits} commits and 6-9 variants"
        f" each; ledger scanned in {scan_s:.2f} s; {refusals} refusals recorded (with warm-up)"
    )
    print(f"warm-up: each of the {len(first_t)} distinct requests once (row 'first call'); then {len(led_t)} calls")
    print(
        f"ledger: {len(led_t)} calls, {n_ok} resolved, {len(led_t) - n_ok} refused (KernelUnavailable); "
        f"live (ours) resolved {sum(ours_ok)}/{len(ours_ok)}"
    )
    rows = [
        ("ledger (offline)", led_t, None),
        ("  of which resolved", [t for t, ok in zip(led_t, led_ok, strict=False) if ok], None),
        ("  of which refused", [t for t, ok in zip(led_t, led_ok, strict=False) if not ok], None),
        ("ledger, first call per request", first_t, None),
        *server_rows,
        ("live (ours, fresh ledger)", ours_t, ours_req),
        ("live (kernels.get_kernel_variants)", kern_t, kern_req),
    ]
    base = stats(led_t)[0]
    print(f"{'':36} {'calls':>6} {'p50 ms':>9} {'p99 ms':>9} {'mean ms':>9} {'HTTP/call':>9}  vs ledger p50")
    for label, ts, req in rows:
        if not ts:
            print(f"{label:36} {0:>6}")
            continue
        p50, p99, mean = stats(ts)
        digits = 0 if p50 > 10 * base else 1
        ratio = f"{p50 / base:.1f}x" if req is None else f"live/ledger = {p50 / base:.{digits}f}x"
        http = "-" if req is None else f"{req:.1f}"
        print(f"{label:36} {len(ts):>6} {p50:>9.3f} {p99:>9.3f} {mean:>9.3f} {http:>9}  {ratio}")
    p99 = stats(led_t)[1]
    print(f"target: ledger p99 < 2 ms: {'PASS' if p99 < 2 else 'FAIL'} ({p99:.2f} ms)")
    if server_rows:
        p99 = stats(server_rows[0][1])[1]
        print(f"target: server ledger p99 < 5 ms: {'PASS' if p99 < 5 else 'FAIL'} ({p99:.2f} ms)")


if __name__ == "__main__":
    main()
