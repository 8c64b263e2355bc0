"""Pull-through under a cache cap: one Zipf-like sequence of requests through `serve --upstream`, uncapped
and with `--cache-max` a third of the working set.

    python -m bench.pull_cap [--quick]      (also the second part of `python -m bench.pull_through`)

The upstream is the test fake Hub with the real Hub's redirects (LFS bodies from its CDN host), holding 40
LFS files of 256 KiB to 1 MiB (sizes drawn with a fixed seed) over 5 kernel repos, about 25 MiB: the
working set (--quick: 16 files of 96-256 KiB over 4 repos). One sequence of 600 requests (--quick: 160)
is drawn once with a fixed seed, Zipf-like: the file of popularity rank r is asked with weight 1/r^1.1,
the ranks shuffled so that popularity does not follow size. It is replayed twice through unmodified
huggingface_hub `hf_hub_download` (force_download: HEAD then GET each time), 4 client threads of one child
process taking the next request in turn, each run against a `frt-mirror serve --upstream HUB --allow ORG`
of a fresh home: uncapped, then with `--cache-max` a third of the working set.

Per run: requests, failed (an exception in the client), wrong (a file whose sha256 is not the listed one:
every answer is hashed), the hit rate (answers the mirror gave from its store: the requests less the file
bodies the fake Hub sent, counted from its request log), the upstream bytes (file body bytes the fake Hub
sent, both hosts), evictions (serve's /metrics, frt_mirror_evicted_blobs_total), the store's bytes at the
end (the blobs on disk, all pulled: the home stages nothing), and the wall time. Beside them: the hit rate
an exact LRU of the cap's bytes gets on the same sequence in order (the clients' threads reorder it a
little), and the capped run's figures over the uncapped run's. Exit 1 unless both runs had 0 failed, 0
wrong bytes, the capped store ended within the cap, and the capped hit rate is below the uncapped one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import tempfile
import urllib.request
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from bench.child import run_child
from bench.serve import emit
from bench.serve_proc import client_env, serve, serve_logs

ROOT = Path(__file__).resolve().parents[1]
KiB, MiB = 1 << 10, 1 << 20
ORG, SEED, ZIPF_S, THREADS = "bench-org", 49, 1.1, 4


@dataclass(frozen=True)
class Shape:
    files: int
    repos: int
    smallest: int
    largest: int
    requests: int


FULL = Shape(files=40, repos=5, smallest=256 * KiB, largest=1 * MiB, requests=600)
QUICK = Shape(files=16, repos=4, smallest=96 * KiB, largest=256 * KiB, requests=160)


@dataclass(frozen=True)
class File:
    repo: str
    path: str
    sha256: str
    size: int


def child_replay(job: dict) -> dict:
    """Replay `job["seq"]` with `job["threads"]` threads, each taking the next request in turn; every
    answer's sha256 checked."""
    import threading
    import time

    from huggingface_hub import hf_hub_download

    seq, lock, at = job["seq"], threading.Lock(), [0]
    ok, wrong, errors = [0], [0], []

    def worker(t: int) -> None:
        while True:
            with lock:
                i, at[0] = at[0], at[0] + 1
            if i >= len(seq):
                return
            repo, path, want = seq[i]
            try:
                got = hf_hub_download(
                    repo,
                    path,
                    repo_type="kernel",
                    revision="v1",
                    cache_dir=f"{job['caches']}/t{t}",
                    endpoint=job["endpoint"],
                    force_download=True,  # the client's own cache would answer a repeat: every request reaches serve
                )
                with open(got, "rb") as f:
                    same = hashlib.file_digest(f, "sha256").hexdigest() == want
                with lock:
                    ok[0] += same
                    wrong[0] += not same
            except Exception as e:  # counted as failed, the first few shown
                with lock:
                    errors.append(repr(e)[:300])

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(job["threads"])]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    return {"wall": wall, "ok": ok[0], "wrong": wrong[0], "failed": len(errors), "errors": errors[:3]}


def fixture(shape: Shape) -> tuple[list, list[File]]:
    """The fake Hub's repos and the files a client asks for, in popularity order (rank 1 first)."""
    from tests.support.fakehub import FakeRepo
    from tests.support.kernel_fixtures import variant_files

    rnd = random.Random(SEED)
    sizes = [rnd.randrange(shape.smallest, shape.largest + 1) for _ in range(shape.files)]
    repos, files = [], []
    for k in range(shape.repos):
        mine = range(k, shape.files, shape.repos)
        data = {f"_blob{j}.bin": hashlib.shake_128(b"pull_cap %d" % j).digest(sizes[j]) for j in mine}
        repo = FakeRepo(f"{ORG}/cap{k}")
        repo.commit(variant_files(f"cap{k}", "torch-universal", version=1, extra=data), title="w", branch="v1")
        repos.append(repo)
        for name, body in data.items():
            path = f"build/torch-universal/{name}"
            files.append(File(repo.repo_id, path, hashlib.sha256(body).hexdigest(), len(body)))
    rnd.shuffle(files)
    return repos, files


def sequence(files: list[File], n: int) -> list[File]:
    weights = [1 / (r**ZIPF_S) for r in range(1, len(files) + 1)]
    return random.Random(SEED + 1).choices(files, weights=weights, k=n)


def lru_hit_rate(seq: list[File], cap: int | None) -> float:
    """An exact LRU of `cap` bytes (None: unbounded) over `seq` in order; a miss keeps the file."""
    kept: OrderedDict[str, int] = OrderedDict()
    hits = 0
    for f in seq:
        if f.sha256 in kept:
            hits += 1
            kept.move_to_end(f.sha256)
            continue
        kept[f.sha256] = f.size
        while cap is not None and sum(kept.values()) > cap:
            kept.popitem(last=False)
    return hits / len(seq)


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of the series `name` whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in " {") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.split()[-1])
    return total


def store_bytes(home: Path) -> int:
    return sum(p.stat().st_size for p in (home / "store" / "sha256").glob("??/*"))


def replay(hub, tmp: Path, name: str, seq: list[File], cap: int | None) -> dict:
    """One run: a fresh home's serve, the sequence through it; its figures."""
    wanted = {f.sha256 for f in seq}
    hub.reset_log()
    before = hub.body_bytes
    args = ["--upstream", hub.url, "--allow", ORG] + ([] if cap is None else ["--cache-max", str(cap)])
    proc, url = serve(tmp / f"home-{name}", tmp, *args)
    try:
        job = {
            "endpoint": url,
            "caches": str(tmp / f"caches-{name}"),
            "threads": THREADS,
            "seq": [(f.repo, f.path, f.sha256) for f in seq],
        }
        r = run_child("bench.pull_cap", "--child", job=job, env=client_env(), timeout=600)
        with urllib.request.urlopen(f"{url}/metrics", timeout=30) as m:
            metrics = m.read().decode()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    # A file body the mirror fetched: a 2xx GET of one of the files' CDN objects (every file is LFS).
    bodies = sum(
        1
        for e in hub.request_log
        if e.method == "GET" and e.server == "cdn" and 200 <= e.status < 300 and e.path[5:].split("?")[0] in wanted
    )
    return {
        **r,
        "requests": len(seq),
        "hit_rate": 1 - bodies / len(seq),
        "upstream": hub.body_bytes - before,
        "evicted": metric(metrics, "frt_mirror_evicted_blobs_total"),
        "kept": metric(metrics, "frt_mirror_pull_seconds_count", kind="file", outcome="ok"),
        "passed": metric(metrics, "frt_mirror_pull_seconds_count", kind="file", outcome="passed"),
        "store": store_bytes(tmp / f"home-{name}"),
        "cap": cap,
    }


def compare(quick: bool) -> bool:
    """Both runs, printed; True where the checks hold."""
    sys.path.insert(0, str(ROOT))
    from tests.support.fakehub import FakeHub

    shape = QUICK if quick else FULL
    repos, files = fixture(shape)
    seq = sequence(files, shape.requests)
    working = sum(f.size for f in {f.sha256: f for f in seq}.values())
    cap = working // 3
    with (
        tempfile.TemporaryDirectory(prefix="frt-bench-pull-cap-") as t,
        FakeHub(repos, redirects=True, trusted_orgs=[ORG]) as hub,
    ):
        assert min(f.size for f in files) >= hub.lfs_threshold  # every body comes from the CDN host
        runs = {"uncapped": replay(hub, Path(t), "uncapped", seq, None)}
        runs["capped"] = replay(hub, Path(t), "capped", seq, cap)
        if any(r["failed"] for r in runs.values()):
            print(serve_logs(Path(t)), file=sys.stderr)
    distinct = len({f.sha256 for f in seq})
    print(
        f"\npull-through under a cache cap: {shape.requests} requests (Zipf-like, s={ZIPF_S}, seed {SEED}) over "
        f"{distinct} of {shape.files} files of {shape.smallest // KiB}-{shape.largest // KiB} KiB in "
        f"{shape.repos} repos ({working / MiB:.1f} MiB working set), {THREADS} hf_hub_download threads, "
        "a fresh home each"
    )
    print(
        f"{'':22}{'requests':>9}{'failed':>8}{'wrong':>7}{'hit rate':>10}{'LRU sim':>9}{'upstream MiB':>14}"
        f"{'x working':>11}{'evicted':>9}{'store MiB':>11}{'wall s':>8}"
    )
    labels = {"uncapped": "uncapped", "capped": f"--cache-max {cap / MiB:.1f} MiB"}
    for name, r in runs.items():
        print(
            f"{labels[name]:22}{r['requests']:>9}{r['failed']:>8}{r['wrong']:>7}{r['hit_rate']:>10.3f}"
            f"{lru_hit_rate(seq, r['cap']):>9.3f}{r['upstream'] / MiB:>14.1f}{r['upstream'] / working:>11.2f}"
            f"{r['evicted']:>9.0f}{r['store'] / MiB:>11.1f}{r['wall']:>8.1f}"
        )
    for name, r in runs.items():
        if r["errors"]:
            print(f"  {labels[name]}: first failures {r['errors']}")
    print(
        "  hit rate: the requests less the file bodies the fake Hub sent (its request log); LRU sim: an exact\n"
        "  LRU of the cap's bytes on the sequence in order; /metrics' file pulls stored, passed through unkept: "
        + "; ".join(f"{labels[n]} {r['kept']:.0f}, {r['passed']:.0f}" for n, r in runs.items())
    )
    u, c = runs["uncapped"], runs["capped"]
    print(
        f"capped/uncapped, a cap of 1/3 of the working set: hit rate {c['hit_rate'] / u['hit_rate']:.2f}, "
        f"upstream bytes {c['upstream'] / u['upstream']:.2f}, store bytes {c['store'] / u['store']:.2f}, "
        f"wall time {c['wall'] / u['wall']:.2f}"
    )
    checks = {
        "0 failed": all(r["failed"] == 0 for r in runs.values()),
        "0 wrong bytes": all(r["wrong"] == 0 and r["ok"] == r["requests"] for r in runs.values()),
        "store <= cap": c["store"] <= cap,
        "hit rate capped < uncapped": c["hit_rate"] < u["hit_rate"],
    }
    print("checks: " + ", ".join(f"{k} {'ok' if v else 'FAILED'}" for k, v in checks.items()))
    return all(checks.values())


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.pull_cap", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="16 files, 160 requests (< 1 min)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return emit(child_replay(json.load(sys.stdin)))
    if not compare(args.quick):
        sys.exit(1)


if __name__ == "__main__":
    main()
