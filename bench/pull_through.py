"""Pull-through: 64 cold clients through `serve --upstream` vs. the same 64 straight to the upstream, and
warm hits through it vs. a staged `serve`.

    python -m bench.pull_through [--quick]

The upstream is the test fake Hub with the real Hub's redirects (LFS bodies from a CDN host), holding
one kernel whose torch-universal build carries a 64 MiB LFS file (--quick: 2 MiB). Each row is 64
concurrent `hf_hub_download`s of that file (threads of one child process, each into its own fresh cache
dir, HEAD then GET as the client does): the upstream's body bytes / file size (what the link to the Hub
carried: target 1.0 through the mirror) and wall time. Then the same 64 again through the same
mirror, now warm, vs. a `serve` of a home where the file was staged the ordinary way (`stage`):
3 runs each, interleaved, median wall time (the clients share one GIL: the figure is the pair's ratio).

Then bench/pull_cap.py: one Zipf-like sequence of requests over more distinct files than a cap of a third
of them holds, through serve --upstream uncapped and with --cache-max: hit rate, upstream bytes, evictions,
store bytes (its docstring says how each is counted). Exit 1 where its checks fail.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.child import run_child
from bench.pull_cap import compare
from bench.serve import emit, stage_v1
from bench.serve_proc import client_env, serve, serve_logs

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
REPO, VARIANT = "bench-org/pull", "torch-universal"
FILE = f"build/{VARIANT}/_weights.bin"
CLIENTS, RUNS = 64, 3


def child_clients(endpoint: str, caches: str, n: int) -> dict:
    """`n` concurrent hf_hub_downloads into fresh caches; wall seconds and every file's sha256."""
    import threading

    from huggingface_hub import hf_hub_download

    shas, errors = [], []

    def one(i: int) -> None:
        try:
            path = hf_hub_download(
                REPO, FILE, repo_type="kernel", revision="v1", cache_dir=f"{caches}/c{i}", endpoint=endpoint
            )
            with open(path, "rb") as f:
                shas.append(hashlib.file_digest(f, "sha256").hexdigest())
        except Exception as e:  # reported, and the run fails
            errors.append(repr(e))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"wall": time.perf_counter() - t0, "shas": sorted(set(shas)), "ok": len(shas), "errors": errors[:3]}


def clients(endpoint: str, tmp: Path, name: str) -> dict:
    return run_child(
        "bench.pull_through", "--child", endpoint, str(tmp / name), str(CLIENTS), env=client_env(), timeout=900
    )


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.pull_through", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a 2 MiB file, one warm run each (< 1 min)")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return emit(child_clients(args.child[0], args.child[1], int(args.child[2])))
    sys.path.insert(0, str(ROOT))
    from tests.support.fakehub import FakeHub, FakeRepo
    from tests.support.kernel_fixtures import variant_files

    size = (2 if args.quick else 64) * MiB
    payload = hashlib.shake_128(b"bench.pull_through").digest(size)
    repo = FakeRepo(REPO)
    repo.commit(variant_files("pull", VARIANT, version=1, extra={"_weights.bin": payload}), title="w", branch="v1")
    want = hashlib.sha256(payload).hexdigest()
    rows, procs = {}, []
    with (
        tempfile.TemporaryDirectory(prefix="frt-bench-pull-") as t,
        FakeHub([repo], redirects=True, trusted_orgs=["bench-org"]) as hub,
    ):
        tmp = Path(t)

        def run(name: str, endpoint: str) -> None:
            before = hub.body_bytes
            caches = f"{name}-{len(rows.get(name, []))}"
            r = clients(endpoint, tmp, caches)
            # 64 clients' copies of the file (4 GiB a run at 64 MiB): gone once checked, or the 8 runs'
            # 32 GiB fill the disk (they did, on the 2-core VM: the staged runs' clients got ENOSPC).
            shutil.rmtree(tmp / caches, ignore_errors=True)
            if r["errors"] or r["ok"] != CLIENTS or r["shas"] != [want]:
                sys.exit(f"{name}: {r['ok']}/{CLIENTS} correct, errors {r['errors']}\nserve's log:\n{serve_logs(tmp)}")
            rows.setdefault(name, []).append({**r, "upstream": (hub.body_bytes - before) / size})

        try:
            run("direct", hub.url)
            p, mirror = serve(tmp / "pulled", tmp, "--upstream", hub.url, "--allow", "bench-org")
            procs.append(p)
            run("cold", mirror)
            stage_v1(tmp / "staged", hub.url, REPO, "torch2.13-cpu-x86_64-linux")
            p, staged = serve(tmp / "staged", tmp)
            procs.append(p)
            for _ in range(1 if args.quick else RUNS):  # warm hits: interleaved, the median of each
                run("warm", mirror)
                run("staged", staged)
        finally:
            for p in procs:
                p.terminate()
                p.wait(timeout=10)
    report_rows(rows, size)
    if not compare(args.quick):
        sys.exit(1)


def report_rows(rows: dict, size: int) -> None:
    mb = CLIENTS * size / 1e6
    print(
        f"pull-through: {CLIENTS} concurrent cold hf_hub_download of one {size // MiB} MiB LFS file "
        f"(fake Hub, redirects to its CDN host)"
    )
    print(f"{'':34}{'upstream bytes / file size':>28}{'wall s':>9}{'client MB/s':>13}")
    labels = {
        "direct": "straight to the upstream",
        "cold": "through serve --upstream (cold)",
        "warm": "through serve --upstream (warm)",
        "staged": "staged serve (no upstream)",
    }
    rows = {
        name: {"upstream": max(r["upstream"] for r in runs), "wall": statistics.median(r["wall"] for r in runs)}
        for name, runs in rows.items()
    }
    for name, label in labels.items():
        r = rows[name]
        print(f"{label:34}{r['upstream']:>28.2f}{r['wall']:>9.2f}{mb / r['wall']:>13.1f}")
    print(
        f"upstream bytes / file size through the mirror = {rows['cold']['upstream']:.2f} (target 1.0; "
        f"straight: {rows['direct']['upstream']:.2f})"
    )
    print(f"cold wall-time ratio mirror/straight = {rows['cold']['wall'] / rows['direct']['wall']:.2f}")
    print(f"warm-hit throughput ratio pull-through/staged serve = {rows['staged']['wall'] / rows['warm']['wall']:.2f}")


if __name__ == "__main__":
    main()
