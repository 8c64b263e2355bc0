"""Staging: `frt.mirror.stage.kernels.stage` vs. the snapshot_download loop a user scripts today.

    python -m bench.stage [--quick] [--store s3]

Rows: the baseline, `huggingface_hub.snapshot_download(repo, repo_type="kernel", revision=<commit>,
allow_patterns=["build/<variant>/*"], cache_dir=<a fresh cache per target>)` for each target and repo
in turn; ours, `stage(..., jobs=8)` on a fresh home (it scans, resolves and downloads: all timed); and
ours again on the same home. The baseline is handed the (commit, variant) our resolver chose from a
ledger scanned beforehand: that resolution is not timed, so the baseline pays for downloads only.

The fake Hub runs in this process behind a simulated WAN (20 ms before every answer, ~50 MB/s per
connection). Each client runs in a child process: huggingface_hub reads HF_ENDPOINT when imported,
and a client sharing the GIL with the server would be slowed by it.

Then ours twice more behind the real Hub's transport (307s to the resolve cache, 302s to a CDN host):
with the Hub's own quotas for an anonymous IP, which a stage of this size does not meet (the row the
target is on), and with quotas small enough that it does (`same, quota met`: its 429s waited out, and
the least wall any pacing could reach under them printed beside it).

Then the peak RSS of `frt-mirror stage` for a 5 GiB model repo beside a 50 MiB one (bench/stage_rss.py:
the CLI on the filesystem store, its own max RSS from wait4; ~75 s of the run; 512 MiB with --quick).

Last, staging inside a quota the stage needs many windows of (bench/quota.py): the requests needed,
sent and refused, and the wall against the quota's floor.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import stat
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import unquote, urlsplit

from bench.child import run_child

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
CU11, CU12 = "torch211-cxx11-cu130-x86_64-linux", "torch212-cxx11-cu130-x86_64-linux"
ARM, CPU = "torch211-cxx11-cu130-aarch64-linux", "torch213-cxx11-cpu-x86_64-linux"
SA_X86, SA_ARM = "torch-stable-abi211-cu130-x86_64-linux", "torch-stable-abi211-cu130-aarch64-linux"
TARGETS = [
    "torch2.11-cu130-x86_64-linux",
    "torch2.12-cu130-x86_64-linux",
    "torch2.11-cu130-aarch64-linux",
    "torch2.13-cpu-x86_64-linux",
]
# repo -> version -> commits on branch v<version>, oldest first; a commit maps variant -> (payload seed, MiB)
# or None (pure Python: __init__.py + metadata.json only). One seed is one content, as on the real Hub:
# an abi3 .so identical in two torch variants, carried over unchanged by a rebuild or a new version.
ACT_ARM_CPU = {ARM: ("act-arm", 20), CPU: ("act-cpu", 6)}
REPOS = {
    "activation": {
        1: [
            {CU11: ("act-cu", 24), CU12: ("act-cu", 24), **ACT_ARM_CPU},
            {CU11: ("act-cu.2", 24), CU12: ("act-cu.2", 24), **ACT_ARM_CPU},
        ],  # a CUDA rebuild
        2: [{CU11: ("act2-cu", 24), CU12: ("act2-cu", 24), **ACT_ARM_CPU}],
    },
    "rmsnorm": {1: [{SA_X86: ("rms-x86", 32), SA_ARM: ("rms-arm", 28), CPU: ("rms-cpu", 8)}]},  # stable ABI
    "attention": {1: [{CU11: ("attn-11", 40), CU12: ("attn-12", 40), ARM: ("attn-arm", 36)}]},  # no CPU build
    "moe": {1: [{CU11: ("moe-11", 16), CU12: ("moe-12", 16), ARM: ("moe-arm", 16), "torch-universal": None}]},
    "triton-ops": {1: [{"torch-cuda": ("tri-cubins", 2), "torch-universal": None}]},  # noarch: 3 CUDA targets
    "quant": {1: [{"torch-universal": ("quant-tables", 4)}]},  # one noarch build for every target
}
QUICK_REPOS, QUICK_SCALE = ("activation", "rmsnorm", "triton-ops", "quant"), 1 / 8
DELAY_S, RATE = 0.02, 50e6
JOBS = 8


@functools.cache
def payload(seed: str, nbytes: int) -> bytes:
    """Deterministic incompressible bytes, like kernel_fixtures.blob but ~30x faster at these sizes."""
    return hashlib.shake_128(seed.encode()).digest(nbytes)


def make_repos(names, scale: float) -> list:
    from tests.support.fakehub import FakeRepo
    from tests.support.kernel_fixtures import variant_files

    repos = []
    for name in names:
        repo = FakeRepo(f"bench-org/{name}")
        for version, commits in REPOS[name].items():
            for i, variants in enumerate(commits):
                change: dict = {"README.md": f"# {name}\n".encode(), "build/": None}
                for variant, spec in variants.items():
                    fname = "_ops.abi3.so" if variant.endswith("-linux") else "_tables.bin"
                    extra = {fname: payload(spec[0], int(spec[1] * scale * MiB))} if spec else {}
                    change.update(variant_files(name, variant, version=version, extra=extra))
                repo.commit(change, title=f"v{version} build {i}", branch=f"v{version}")
        repo.branch("main", f"v{max(REPOS[name])}")
        repos.append(repo)
    return repos


def hub_env(url: str, hf_home: str) -> None:
    """Point huggingface_hub (read at import time) at the fake Hub; call before importing it."""
    os.environ.update(
        HF_ENDPOINT=url, HF_HOME=hf_home, HF_HUB_DISABLE_XET="1", HF_HUB_DISABLE_PROGRESS_BARS="1"
    )  # off on both sides: ours runs with progress=False
    for var in ("HF_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_DISABLE_TELEMETRY"):
        os.environ.pop(var, None)


def child(kind: str, url: str, job: dict) -> dict:
    """Runs in the child process: one client, its wall time (imports and setup excluded)."""
    hub_env(url, job["hf_home"])
    if kind == "baseline":
        from huggingface_hub import snapshot_download

        t0 = time.perf_counter()
        for target, repo, commit, variant in job["plan"]:
            snapshot_download(
                repo,
                repo_type="kernel",
                revision=commit,
                allow_patterns=[f"build/{variant}/*"],
                cache_dir=Path(job["caches"]) / target,
            )
        return {"wall": time.perf_counter() - t0}
    from frt.mirror.stage.kernels import stage
    from frt.mirror.store.home import Home
    from frt.resolver.hub import HubClient
    from frt.resolver.resolve import make_request
    from frt.resolver.targets import parse_target

    home, hub = Home(Path(job["home"]), ledger_url=job.get("ledger"), store_url=job.get("store")), HubClient(url)
    requests = [make_request(repo, version=v) for repo, v in job["requests"]]
    targets = [parse_target(t) for t in job["targets"]]
    t0 = time.perf_counter()
    report = stage(requests, targets, home=home, hub=hub, jobs=JOBS, progress=False)
    return {
        "wall": time.perf_counter() - t0,
        "downloaded": report.downloaded_bytes,
        "waited": hub.pacer.waited,
        "staged": [[r.target, r.repo, r.commit, r.variant] for r in report.rows if r.status == "staged"],
    }


def stage_child(kind: str, hub, repos: dict, job: dict) -> tuple[dict, dict]:
    hub.reset_log()
    return run_child("bench.stage", "--child", kind, hub.url, job=job), traffic(hub.requests, repos)


def traffic(log: list, repos: dict) -> dict:
    """Requests answered, and bytes served as file bodies: the hub logs (method, path, status) only, so
    each 200's length is the served file's, looked up by where the body came from — `/resolve/` (the
    plain upstream), `/api/resolve-cache/` (a small file after the Hub's 307) or `/cdn/<sha256>` (an
    LFS file after the 302). Redirects and refusals carry no file body."""
    by_sha = {
        hashlib.sha256(d).hexdigest(): len(d)
        for r in repos.values()
        for c in r.commits.values()
        for d in c.files.values()
        if d is not None
    }
    served = limited = 0
    buckets = {"api": 0, "resolvers": 0}  # answers other than 429, by the fake Hub's rate-limit bucket
    for method, raw, status in log:
        limited += status == 429
        if status != 429 and (bucket := rate_bucket(raw)) is not None:
            buckets[bucket] += 1
        if method != "GET" or status >= 300:
            continue
        # A resumed (206) body's length is not in the log; none happen without injected failures.
        assert status == 200, f"{raw}: {status}, its length is unknown"
        s = [unquote(x) for x in urlsplit(raw).path.split("/")[1:]]
        if s[0] == "cdn":
            served += by_sha[s[1]]
        elif s[:2] == ["api", "resolve-cache"]:  # api/resolve-cache/kernels/org/name/sha/path
            repo = repos[f"{s[3]}/{s[4]}"]
            served += len(repo.commits[s[5]].files["/".join(s[6:])])
        elif len(s) > 4 and s[3] == "resolve":  # kernels/org/name/resolve/rev/path
            repo = repos[f"{s[1]}/{s[2]}"]
            served += len(repo.commits[repo.resolve_ref(s[4])].files["/".join(s[5:])])
    heads = sum(m == "HEAD" for m, _, _ in log)
    return {"requests": len(log), "heads": heads, "bytes": served, "limited": limited, "buckets": buckets}


def rate_bucket(raw: str) -> str | None:
    """The real Hub's rate-limit bucket of a request, as the fake Hub counts it: resolve URLs and the
    resolve cache are "resolvers", other /api/ calls "api", the CDN's none."""
    s = urlsplit(raw).path.split("/")[1:]
    if s[:2] == ["api", "resolve-cache"] or (len(s) >= 5 and "resolve" in s[2:4]):
        return "resolvers"
    return "api" if s[:1] == ["api"] else None


# The real Hub's quotas for an anonymous IP (hub-docs rate-limits.md): a stage of this size does not meet them.
HUB_LIMITS = (500, 3000, 300)
# Quotas small enough that the stage meets them (api calls and resolver calls past them get 429s).
TIGHT_LIMITS = {True: (20, 40, 2), False: (40, 80, 3)}  # by --quick


def real_transport_hub(repos: dict, limits: tuple[int, int, int]):
    """The same repos behind the real Hub's transport: 307s to the resolve cache, 302s to a CDN host with
    signed URLs, and fixed-window rate limits of (api, resolvers, window s)."""
    from tests.support.fakehub import FakeHub
    from tests.support.fakehub.ratelimit import RateLimits

    api, resolvers, window = limits
    hub = FakeHub(
        list(repos.values()),
        page_size=1000,
        redirects=True,
        rate_limits=RateLimits(api=api, resolvers=resolvers, window=window),
    )
    hub.start()
    hub.faults.delay("", DELAY_S)
    for where in ("/resolve/", "/resolve-cache/", "/cdn/"):
        hub.faults.throttle(where, RATE)
    return hub


def stage_real(repos: dict, job: dict, name: str, limits: tuple[int, int, int]) -> tuple[dict, dict]:
    """`ours` on a fresh home (tmp home + `name`) behind real_transport_hub."""
    hub = real_transport_hub(repos, limits)
    try:
        return stage_child("ours", hub, repos, dict(job, home=job["home"] + name))
    finally:
        hub.stop()


def stage_on_s3(hub, repos: dict, job: dict) -> tuple[dict, dict]:
    """`ours` again, the blobs into an S3 store on a SeaweedFS and the ledger on a PostgreSQL, both started
    here (tests/support) and stopped after."""
    from tests.support.pgserver import PgServer
    from tests.support.s3server import S3Server

    with PgServer() as pg, S3Server() as s3:
        os.environ.update(s3.env())  # the child's, as a stager host's environment names the store
        return stage_child("ours", hub, repos, dict(job, ledger=pg.url, store=s3.new_prefix()))


def file_bytes(root: Path, under: str = "") -> int:
    """Bytes of the distinct regular files below `root` (hard links counted once, symlinks not at all)."""
    seen = {}
    for dirpath, _, names in os.walk(root):
        for st in (os.lstat(Path(dirpath) / n) for n in names if under in dirpath):
            if stat.S_ISREG(st.st_mode):
                seen[(st.st_dev, st.st_ino)] = st.st_size
    return sum(seen.values())


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.stage", description=__doc__.splitlines()[0])
    ap.add_argument(
        "--quick",
        action="store_true",
        help="fewer repos, 1/8-size files, a 512 MiB model for the RSS row (~1 min), for tests",
    )
    ap.add_argument(
        "--store",
        choices=("files", "s3"),
        default="files",
        help="s3: also stage into an S3 store (a SeaweedFS and a PostgreSQL started here): row 'ours, S3 store'",
    )
    ap.add_argument("--child", nargs=2, metavar=("KIND", "URL"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return print(json.dumps(child(*args.child, json.load(sys.stdin))))

    tmp_dir = tempfile.TemporaryDirectory(prefix="frt-bench-stage-")
    hub_env("http://unused.invalid", tmp_dir.name)  # the parent scans with the fake Hub's url explicitly
    from frt.mirror.store.view_trees import repo_folder
    from frt.resolver.hub import HubClient
    from frt.resolver.ledger import Ledger
    from frt.resolver.resolution import Resolution
    from frt.resolver.resolve import make_request, refresh_and_decide
    from frt.resolver.scan import scan
    from frt.resolver.targets import parse_target
    from tests.support.fakehub import FakeHub

    repos = {r.repo_id: r for r in make_repos(*((QUICK_REPOS, QUICK_SCALE) if args.quick else (REPOS, 1.0)))}
    req_pairs = [(r, v) for r in repos for v in REPOS[r.split("/")[1]]]
    hub = FakeHub(list(repos.values()), page_size=1000)  # one page per listing, as the real Hub here
    hub.start()
    with tmp_dir as tmp_name:
        tmp, hf_home = Path(tmp_name), str(Path(tmp_name) / "hf")
        # The baseline's plan: our resolver on a ledger scanned beforehand (before the WAN is simulated).
        ledger = Ledger(tmp / "plan.sqlite")
        t0 = time.perf_counter()
        for repo_id in repos:
            scan(repo_id, hub=HubClient(hub.url), ledger=ledger)
        scan_s = time.perf_counter() - t0
        outcomes = refresh_and_decide(
            [make_request(r, version=v) for r, v in req_pairs],
            targets=[parse_target(t) for t in TARGETS],
            ledger=ledger,
            offline=True,
        )
        ledger.close()
        resolved = [o for o in outcomes if isinstance(o, Resolution)]
        plan = sorted([str(o.target), o.repo, o.commit, o.variant] for o in resolved)  # target by target
        # Needed: each distinct content once, keyed as stage keys it (advertised sha256, else git oid).
        needed = {f.sha256 or f.git_oid: f.size for o in resolved for f in o.files}
        needed_bytes = sum(needed.values())

        hub.faults.delay("", DELAY_S)  # every request, both sides: a round trip to a far Hub
        hub.faults.throttle("/resolve/", RATE)  # per connection: parallel downloads do add up
        base, base_net = stage_child(
            "baseline", hub, repos, {"plan": plan, "caches": str(tmp / "caches"), "hf_home": hf_home}
        )
        job = {"requests": req_pairs, "targets": TARGETS, "home": str(tmp / "home"), "hf_home": hf_home}
        ours, ours_net = stage_child("ours", hub, repos, job)
        again, again_net = stage_child("ours", hub, repos, job)
        on_s3 = stage_on_s3(hub, repos, dict(job, home=str(tmp / "home-s3"))) if args.store == "s3" else None
        hub.stop()
        ours_real, real_net = stage_real(repos, job, "-real", HUB_LIMITS)
        tight = TIGHT_LIMITS[args.quick]
        ours_tight, tight_net = stage_real(repos, job, "-tight", tight)

        # Dedup: what each staged (target, repo) view references, against the distinct blobs in the store.
        home = tmp / "home"
        views = [
            home / "views" / "local" / repo_folder(repo) / commit / "build" / variant
            for _, repo, commit, variant in ours["staged"]
        ]
        referenced = sum(p.stat().st_size for v in views for p in v.rglob("*") if p.is_file())
        stored = file_bytes(home / "store" / "sha256")
        base_disk = file_bytes(tmp / "caches", under=f"{os.sep}blobs")

    n_pairs = len(req_pairs) * len(TARGETS)
    print(
        f"stage: {len(repos)} repos, {len(req_pairs)} requests x {len(TARGETS)} targets = {n_pairs} pairs: "
        f"{len(plan)} resolve, {n_pairs - len(plan)} refused (no variant; neither side downloads them)"
    )
    print(
        f"simulated WAN: {DELAY_S * 1000:.0f} ms before every answer, {RATE / 1e6:.0f} MB/s per connection "
        f"for file bodies; {len(needed)} distinct files needed, {needed_bytes / MiB:.2f} MiB"
    )
    print(
        "baseline: snapshot_download per (target, repo), sequential, one fresh cache per target, given our "
        f"resolver's\n  (commit, variant) from a ledger scanned beforehand ({scan_s:.2f} s): resolution "
        "NOT timed"
    )
    print("ours: stage(jobs=8) on a fresh home, timed in full (scan + resolve + download + verify + views)")
    if sorted(ours["staged"]) != plan:
        print("WARNING: ours staged other (target, repo, commit, variant) than the baseline's plan")
    print(
        f"\n{'':30} {'wall s':>7} {'fetched MiB':>12} {'needed MiB':>11} {'fetched/needed':>15} "
        f"{'HTTP req':>9} {'of which HEAD':>14}"
    )
    rows = [
        ("baseline (snapshot_download)", base, base_net),
        ("ours (8 jobs, fresh home)", ours, ours_net),
        ("ours rerun (same home)", again, again_net),
        ("ours, real-Hub transport", ours_real, real_net),
        ("same, quota met", ours_tight, tight_net),
        *([("ours, S3 store", *on_s3)] if on_s3 else []),
    ]
    for label, res, net in rows:
        print(
            f"{label:30} {res['wall']:>7.2f} {net['bytes'] / MiB:>12.2f} {needed_bytes / MiB:>11.2f} "
            f"{net['bytes'] / needed_bytes:>15.2f} {net['requests']:>9} {net['heads']:>14}"
        )
    print(
        "  real-Hub transport: 307 to the resolve cache, 302 to a CDN host (signed URLs), the Hub's quotas for an "
        f"anonymous IP\n  ({_quota(HUB_LIMITS)}): {real_net['limited']} answer(s) 429; "
        f"wall {ours_real['wall'] / ours['wall']:.2f}x the plain upstream's"
    )
    print(
        f"  quota met: the same transport, quotas {_quota(tight)}: {tight_net['limited']} answer(s) 429,\n  waited "
        f"out ({ours_tight['waited']:.1f} s of pauses, all threads together); "
        f"wall {ours_tight['wall'] / ours['wall']:.2f}x the plain upstream's"
    )
    for res in (ours_real, ours_tight):
        if sorted(res["staged"]) != sorted(ours["staged"]):
            print("WARNING: a real-transport stage staged other (target, repo, commit, variant) than the plain one")
    if on_s3:
        print(
            f"  S3 store: the same stage into s3://… on SeaweedFS, ledger on PostgreSQL (both on this box): "
            f"wall {on_s3[0]['wall'] / ours['wall']:.2f}x the filesystem store's"
        )
    ratio = ours["wall"] / base["wall"]
    verdict = "PASS" if ratio <= 0.5 else "FAIL"
    print(f"\nwall-time ratio ours/baseline = {ratio:.2f} (target <= 0.5): {verdict}")
    # The link's floor: every needed byte over JOBS connections at the per-connection rate, and the round
    # trips nothing can skip (one per needed file, a refs and a listing per repo) JOBS at a time.
    trips = len(needed) + 2 * len(repos)
    floor = needed_bytes / (JOBS * RATE) + trips * DELAY_S / JOBS
    over = ours["wall"] / floor
    print(
        f"the link's floor = {floor:.2f} s ({needed_bytes / MiB:.2f} MiB over {JOBS} x {RATE / 1e6:.0f} MB/s, "
        f"{trips} round trips of {DELAY_S * 1000:.0f} ms {JOBS} at a time); ours/floor = {over:.2f} "
        f"(target <= 1.5): {'PASS' if over <= 1.5 else 'FAIL'}"
    )
    real_over = ours_real["wall"] / ours["wall"]
    print(
        f"real-Hub transport wall / plain upstream's = {real_over:.2f} (target <= 1.25): "
        f"{'PASS' if real_over <= 1.25 else 'FAIL'}"
    )
    # The tight quota's floor: calls of a bucket past its quota wait for the next window, however paced.
    api, resolvers, window = tight
    quota = {"api": api, "resolvers": resolvers}
    waits = {b: (n - 1) // quota[b] for b, n in tight_net["buckets"].items() if n}
    quota_floor = max(waits.values(), default=0) * window
    print(
        "  calls it needed, by rate-limit bucket: "
        + ", ".join(f"{b} {n}" for b, n in real_net["buckets"].items())
        + f"\n  quota met ({_quota(tight)}): at least {max(waits.values(), default=0)} window(s) waited out, "
        f"wall >= {quota_floor:.1f} s = {quota_floor / ours['wall']:.2f}x the plain upstream's, however paced"
    )
    print(
        f"upstream calls per staged (repo, target) = {ours_net['requests'] / len(plan):.2f} plain, "
        f"{real_net['requests'] / len(plan):.2f} real-Hub transport (baseline {base_net['requests'] / len(plan):.2f})"
    )
    print(
        f"bytes fetched / needed = {ours_net['bytes'] / needed_bytes:.2f} (target 1.00; baseline "
        f"{base_net['bytes'] / needed_bytes:.2f}); ours {ours_net['bytes'] - needed_bytes:+d} B: the scan "
        f"reads each distinct metadata.json once\n  (stage's own count: {ours['downloaded']} B downloaded, "
        f"rerun {again['downloaded']} B)"
    )
    print(
        f"store dedup ratio = {referenced / MiB:.2f} MiB referenced by {len(views)} staged target views / "
        f"{stored / MiB:.2f} MiB in store/sha256 = {referenced / stored:.2f}x\n  (baseline's per-target "
        f"caches hold {base_disk / MiB:.2f} MiB of blobs)"
    )
    print()
    from bench import quota, stage_rss

    stage_rss.main(args.quick)
    print()
    quota.main(args.quick)


def _quota(limits: tuple[int, int, int]) -> str:
    api, resolvers, window = limits
    return f"api {api:,} / resolvers {resolvers:,} per {window} s"


if __name__ == "__main__":
    main()
