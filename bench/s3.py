"""The S3 store beside the filesystem store, in one run: `stage` into each, and `serve` from each.

    python -m bench.s3 [--quick]

Both stores sit on this box: a SeaweedFS (`weed`, from the test extra) for S3, the home's disk for the
filesystem; the ledger of every row is on one PostgreSQL started here (an S3 store needs a ledger server,
so the filesystem rows get one too: the ratio is the store's alone). The filesystem store with its SQLite
ledger, what a one-host site runs, is printed beside them.

stage: bench/stage.py's repos and targets (`stage(..., jobs=8)` on a fresh home, timed in full) behind its
simulated WAN (20 ms before every answer, 50 MB/s per connection), into each store in turn, RUNS times
interleaved, median wall; bytes fetched from the upstream and bytes the store holds after, per row. Beside
them the S3 server's own floor: the same blobs, from the filesystem store's home, uploaded into the bucket
with nothing else running (as an import uploads them): a stage into S3 can end no sooner than its server
ingests the bytes, and on a small box the server shares the cores with the stage and its upstream.

serve: `frt-mirror serve` (one process, uvicorn) of one staged 16 MiB LFS file (--quick: 2 MiB) from each
store, the S3 one being a bundle of the same home imported into it (serve from S3 streams the object
through its process: hashed as it is sent until verified whole, then unhashed If-Match the ETag verified,
as serve on files sends a file verified lately by sendfile: mirror/serve/objects.py); 64 concurrent
keep-alive clients, each HEAD then GET x 2 (bench/serve.py's fetch child), RUNS times interleaved, median
MB/s.

Beside each, the CPU seconds spent (Linux's /proc): on a 2-core box the S3 server, the stager or serve,
the upstream and the clients share two cores, so a ratio there is a CPU budget as much as a wall.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.serve import CLIENTS, MiB, serve_child, stage_big_file, start_serve
from bench.stage import (
    DELAY_S,
    JOBS,
    QUICK_REPOS,
    QUICK_SCALE,
    RATE,
    REPOS,
    TARGETS,
    file_bytes,
    hub_env,
    make_repos,
    stage_child,
)

RUNS = 3
FS_SQLITE, FS, S3 = "filesystem store, SQLite", "filesystem store", "S3 store"
INGEST = "S3 server's ingest alone"  # the same blobs uploaded, no stage: the floor the S3 server sets


def stage_rows(tmp: Path, pg, s3, quick: bool) -> dict[str, list[dict]]:
    """Each store's stage results, RUNS of each, interleaved: wall, bytes fetched and stored."""
    from tests.support.fakehub import FakeHub

    repos = {r.repo_id: r for r in make_repos(*((QUICK_REPOS, QUICK_SCALE) if quick else (REPOS, 1.0)))}
    pairs = [(r, v) for r in repos for v in REPOS[r.split("/")[1]]]
    hub = FakeHub(list(repos.values()), page_size=1000)
    hub.start()
    hub.faults.delay("", DELAY_S)
    hub.faults.throttle("/resolve/", RATE)
    rows: dict[str, list[dict]] = {FS_SQLITE: [], FS: [], S3: [], INGEST: []}
    try:
        for i in range(RUNS):
            for name in (FS_SQLITE, FS, S3):
                home = tmp / f"stage-{i}-{name.replace(' ', '-').replace(',', '')}"
                job = {"requests": pairs, "targets": TARGETS, "home": str(home), "hf_home": str(tmp / "hf")}
                if name != FS_SQLITE:
                    job["ledger"] = pg.new_database()
                if name == S3:
                    job["store"] = s3.new_prefix()
                weed, child = cpu_s(s3.proc.pid), resource.getrusage(resource.RUSAGE_CHILDREN)
                res, net = stage_child("ours", hub, repos, job)
                stored = s3_bytes(job["store"], home) if name == S3 else file_bytes(home / "store" / "sha256")
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                rows[name].append(
                    {
                        "wall": res["wall"],
                        "fetched": net["bytes"],
                        "stored": stored,
                        "stager_cpu": after.ru_utime + after.ru_stime - child.ru_utime - child.ru_stime,
                        "server_cpu": cpu_s(s3.proc.pid) - weed,
                    }
                )
                if name == FS:
                    weed = cpu_s(s3.proc.pid)
                    rows[INGEST].append(dict(ingest(home, s3.new_prefix()), server_cpu=cpu_s(s3.proc.pid) - weed))
    finally:
        hub.stop()
    return rows


def ingest(home: Path, url: str) -> dict:
    """The S3 server's own floor: the blobs a stage put in the filesystem store `home` uploaded into the
    bucket at `url` as an import uploads them (S3BlobStore.commit_synced: UPLOADS_AT_ONCE at a time, each
    in parts or one PUT as stage's are), with nothing else running: no upstream, no hashing, no ledger."""
    from frt.mirror.store.blobs import Digest
    from frt.mirror.store.s3 import S3BlobStore

    store = S3BlobStore(url, home)
    parts = []
    for blob in sorted((home / "store" / "sha256").glob("*/*"), key=lambda b: -b.stat().st_size):
        part = store.scratch.part_path(blob.name)
        os.link(blob, part)  # commit removes the part: a link, so the home's blob stays
        parts.append((part, Digest(blob.name, "", blob.stat().st_size)))
    t0 = time.perf_counter()
    store.commit_synced(parts)
    wall = time.perf_counter() - t0
    stored = s3_bytes(url, home)
    return {"wall": wall, "fetched": 0, "stored": stored}


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used so far (Linux's /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def s3_bytes(url: str, home: Path) -> int:
    """Bytes of the blobs under the S3 store at `url` (one listing)."""
    from frt.mirror.store.s3 import S3BlobStore

    return sum(size for _, size, _ in S3BlobStore(url, home).blob_stats())


def serve_rows(tmp: Path, pg, s3, quick: bool) -> dict[str, list[dict]]:
    """64 clients' HEAD + GET of one file from serve on each store, RUNS times interleaved."""
    shard, rounds = (2 * MiB, 1) if quick else (16 * MiB, 2)
    f = stage_big_file(tmp, MiB, shard)  # the big file is not fetched here: 1 MiB
    env = import_into_s3(f, tmp, pg.new_database(), s3.new_prefix())
    procs, servers, pids = [], {}, {}
    try:
        for name, kw in ((FS, {}), (S3, {"env": env})):
            proc, servers[name] = start_serve(f, tmp, **kw)
            procs.append(proc)
            pids[name] = proc.pid
        rows: dict[str, list[dict]] = {name: [] for name in servers}
        for _ in range(RUNS):
            for name, url in servers.items():
                port, pid = url.rsplit(":", 1)[1], pids[name]
                before = cpu_s(pid), cpu_s(s3.proc.pid)
                res = serve_child("fetch", port, f["shard_url"], str(shard), str(rounds))
                rows[name].append(
                    dict(res, serve_cpu=cpu_s(pid) - before[0], server_cpu=cpu_s(s3.proc.pid) - before[1])
                )
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=10)
    return rows


def import_into_s3(f: dict, tmp: Path, ledger: str, store: str) -> dict[str, str]:
    """The staged home's bundle imported into the S3 store `store` (ledger `ledger`); what a replica on it
    runs with (bench/serve.py's start_serve env: its home, and the variables naming store and ledger)."""
    from frt.mirror.bundle import bundle, import_bundle
    from frt.mirror.store.home import Home

    src = Home(f["home"])
    bundle(tmp / "s3.tar", src)
    src.close()
    dest = Home(tmp / "s3-home", ledger_url=ledger, store_url=store)
    import_bundle(tmp / "s3.tar", dest)
    dest.close()
    (tmp / "s3.tar").unlink()
    env = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    return {**env, "FRT_LEDGER_URL": ledger, "FRT_STORE_URL": store, "home": str(tmp / "s3-home")}


def report(stage: dict[str, list[dict]] | None, serve: dict[str, list[dict]] | None, quick: bool) -> None:
    if stage is not None:
        report_stage(stage, quick)
    if serve is not None:
        report_serve(serve)


def report_stage(stage: dict[str, list[dict]], quick: bool) -> None:
    wall = {name: statistics.median(r["wall"] for r in runs) for name, runs in stage.items()}
    print(
        f"stage: bench/stage.py's {'quick ' if quick else ''}repos x {len(TARGETS)} targets, jobs={JOBS}, behind "
        f"{DELAY_S * 1000:.0f} ms / {RATE / 1e6:.0f} MB/s per connection; ledger on PostgreSQL unless named; "
        f"{RUNS} runs each, interleaved"
    )
    print(f"\n{'':28} {'wall s':>7} {'runs (s)':>20} {'fetched MiB':>12} {'stored MiB':>11}")
    for name, runs in stage.items():
        walls = " ".join(f"{r['wall']:.2f}" for r in runs)
        r = runs[0]
        print(f"{name:28} {wall[name]:>7.2f} {walls:>20} {r['fetched'] / MiB:>12.2f} {r['stored'] / MiB:>11.2f}")
    ratio = wall[S3] / wall[FS]
    print(f"stage wall, S3 store / filesystem store = {ratio:.2f} (target <= 1.25): {_pass(ratio <= 1.25)}")
    print(f"  S3 store / filesystem store with a SQLite ledger = {wall[S3] / wall[FS_SQLITE]:.2f}")
    floor = max(wall[FS], wall[INGEST])
    print(
        f"  the S3 server's floor: its ingest of the same bytes alone {wall[INGEST]:.2f} s; "
        f"S3 store / max(filesystem store, ingest alone) = {wall[S3] / floor:.2f}"
    )
    print(
        f"  CPU s (medians): the S3 server {_med(stage[S3], 'server_cpu'):.2f} in a stage into it, "
        f"{_med(stage[INGEST], 'server_cpu'):.2f} ingesting alone; the stager's process, start-up included, "
        f"{_med(stage[FS], 'stager_cpu'):.2f} on files, {_med(stage[S3], 'stager_cpu'):.2f} on S3; "
        f"{os.cpu_count()} cores here"
    )
    fetched, stored = ({name: {r[k] for r in runs} for name, runs in stage.items()} for k in ("fetched", "stored"))
    same = len(fetched[S3] | fetched[FS]) == 1 and len(stored[S3] | stored[FS]) == 1
    b = max(stored[S3]) / max(stored[FS])
    print(
        f"stage bytes, S3 store / filesystem store = {b:.2f} stored, "
        f"{max(fetched[S3]) / max(fetched[FS]):.2f} fetched (target 1.00): {_pass(same)}"
    )


def report_serve(serve: dict[str, list[dict]]) -> None:
    mbps = {name: statistics.median(r["bytes"] / 1e6 / r["wall"] for r in runs) for name, runs in serve.items()}
    print(f"\nserve: {CLIENTS} concurrent keep-alive clients, each HEAD + GET of one file; {RUNS} runs, interleaved")
    print(f"{'':28} {'MB/s':>7} {'runs (MB/s)':>20}")
    for name, runs in serve.items():
        each = " ".join(f"{r['bytes'] / 1e6 / r['wall']:.0f}" for r in runs)
        print(f"{name:28} {mbps[name]:>7.0f} {each:>20}")
    gb = {name: statistics.median(r["bytes"] for r in runs) / 1e9 for name, runs in serve.items()}
    print(
        f"  CPU s per GB sent (medians): serve {_med(serve[FS], 'serve_cpu') / gb[FS]:.2f} on files, "
        f"{_med(serve[S3], 'serve_cpu') / gb[S3]:.2f} on S3; the S3 server {_med(serve[S3], 'server_cpu') / gb[S3]:.2f}"
    )
    ratio = mbps[S3] / mbps[FS]
    print(
        f"serve at {CLIENTS} clients, S3 store / filesystem store = {ratio:.2f} (target >= 0.8): {_pass(ratio >= 0.8)}"
    )


def _med(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def _pass(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.s3", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="bench/stage.py's quick repos, a 2 MiB file (< 60 s)")
    ap.add_argument("--only", choices=("stage", "serve"), help="one of the two benches")
    args = ap.parse_args()
    from tests.support.pgserver import PgServer
    from tests.support.s3server import S3Server

    with tempfile.TemporaryDirectory(prefix="frt-bench-s3-") as name, contextlib.ExitStack() as stack:
        tmp = Path(name)
        hub_env("http://unused.invalid", str(tmp / "hf"))
        pg, s3 = stack.enter_context(PgServer()), stack.enter_context(S3Server())
        os.environ.update(s3.env())  # the children's, as a stager's or a replica's host names its store
        stage = stage_rows(tmp, pg, s3, args.quick) if args.only != "serve" else None
        serve = serve_rows(tmp, pg, s3, args.quick) if args.only != "stage" else None
    report(stage, serve, args.quick)


if __name__ == "__main__":
    sys.exit(main())
