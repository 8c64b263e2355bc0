"""Bundles: an incremental bundle vs a full one for one new kernel version, and `import` vs `tar -x`.

    python -m bench.bundle [--quick]

The repos of bench.stage (--quick: its quick subset at 1/8 size) are staged for its four targets
from a fake Hub in this process and bundled (A). The upstream then publishes one new kernel version,
bench-org/activation v3 (new payloads for every variant it builds), the home stages it, and writes B
`--since A` and a full bundle of the same set. Rows: each bundle's size and blob count, and the ratio
incremental/full beside what v3's own files weigh (the floor an incremental can reach).

Then two sets are staged and bundled, of 10 MiB and 1 GiB (SETS; --quick: 10 MiB and 128 MiB): bench.stage's
kernels, each with several variants, at a scale, and a model repo (four safetensors shards), every payload
random. Each bundle is imported into a fresh home by the whole `frt-mirror import --quiet` command (every
member copied, sha256- and git-oid-hashed, fsynced into the store, ledger rows and views written), and
unpacked by `tar -xf`, and by `tar -xf` then `sync` (the durability import gives), into a fresh directory:
the same file, page cache warm (read whole before each run), each a child process, runs interleaved,
median of 3. Ratios are speed ratios, tar's seconds over import's. Last, the floors under import on this
box: both hashes of the big bundle's bytes in memory, and Python start-up with the command's imports.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.stage import (
    ARM,
    CPU,
    CU11,
    CU12,
    QUICK_REPOS,
    QUICK_SCALE,
    REPOS,
    TARGETS,
    MiB,
    hub_env,
    make_repos,
    payload,
)

ROOT = Path(__file__).resolve().parents[1]
NEW = {CU11: ("act3-cu", 24), CU12: ("act3-cu", 24), ARM: ("act3-arm", 20), CPU: ("act3-cpu", 6)}
RUNS = 3
# import vs tar -x: name -> (bench.stage's repos at this scale, the model repo's MiB). At scale 1 the repos'
# distinct payloads weigh 312 MiB: 10 MiB and 1 GiB bundles, a quarter of the bigger one a model's weights.
SETS = {"10 MiB": (8 / 312, 2.0), "1 GiB": (768 / 312, 256.0)}
QUICK_SETS = {"10 MiB": (8 / 312, 2.0), "128 MiB": (96 / 312, 32.0)}  # --quick: 1/8 of the big one


def publish_v3(repo, scale: float) -> int:
    """Commit activation v3 on branch v3 (main follows); returns the bytes of its distinct new payloads."""
    from tests.support.kernel_fixtures import variant_files

    change: dict = {"README.md": b"# activation\n", "build/": None}
    for variant, (seed, mib) in NEW.items():
        change.update(
            variant_files(
                "activation", variant, version=3, extra={"_ops.abi3.so": payload(seed, int(mib * scale * MiB))}
            )
        )
    repo.commit(change, title="v3 build 0", branch="v3")
    repo.branch("main", "v3")
    return sum(int(mib * scale * MiB) for mib in dict(NEW.values()).values())  # one blob per seed


def stage_all(home, hub_url: str, pairs) -> None:
    from frt.mirror.stage.kernels import stage
    from frt.resolver.hub import HubClient
    from frt.resolver.resolve import make_request
    from frt.resolver.targets import parse_target

    report = stage(
        [make_request(r, version=v) for r, v in pairs],
        [parse_target(t) for t in TARGETS],
        home=home,
        hub=HubClient(hub_url),
        jobs=8,
        progress=False,
    )
    if report.downloaded_bytes == 0:
        sys.exit("bench.bundle: the stage downloaded nothing")


def timed(cmd: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    wall = time.perf_counter() - t0
    if p.returncode:
        sys.exit(f"{' '.join(cmd[:3])} failed:\n{p.stderr}")
    return wall


def make_set(tmp: Path, name: str, scale: float, model_mib: float) -> Path:
    """A staged set written as a full bundle, `tmp/<name>.tar`: bench.stage's repos at `scale` (several
    kernels, each with several variants) and a model repo of four safetensors shards and its config,
    `model_mib` in all; every payload random, so nothing compresses."""
    from frt.manifests.model import ModelSpec
    from frt.mirror.bundle import bundle
    from frt.mirror.stage.kernels import StageReport
    from frt.mirror.stage.models import stage_models
    from frt.mirror.store.home import Home
    from frt.resolver.hub import HubClient
    from tests.support.fakehub import FakeHub, FakeRepo

    name = name.replace(" ", "").lower()  # "10 MiB": 10mib.tar, bench-org/10mib-model
    repos = make_repos(tuple(REPOS), scale)
    model = FakeRepo(f"bench-org/{name}-model", repo_type="model")
    shard = int(model_mib * MiB / 4)
    weights = {f"model-{i + 1:05d}-of-00004.safetensors": payload(f"{name}-w{i}", shard) for i in range(4)}
    model.commit({"config.json": b'{"model_type": "qwen2"}\n', **weights}, title="weights")
    with FakeHub([*repos, model], page_size=1000) as hub:
        home = Home(tmp / f"{name}-home")
        stage_all(home, hub.url, [(r.repo_id, v) for r in repos for v in REPOS[r.repo_id.split("/")[1]]])
        report = StageReport()
        stage_models((ModelSpec(model.repo_id),), home=home, hub=HubClient(hub.url), report=report)
        if not report.ok:
            sys.exit(f"bench.bundle: the model did not stage: {report.rows}")
        bundle(tmp / f"{name}.tar", home)
        home.close()
    shutil.rmtree(tmp / f"{name}-home")
    return tmp / f"{name}.tar"


def import_vs_tar(full: Path, tmp: Path) -> dict[str, float]:
    """Median wall seconds of `tar -xf`, of `tar -xf` then `sync` and of the whole `frt-mirror import`
    command, each of `full` into a fresh place, each a child process; and the blobs the import stored."""
    env = installed_env()
    exe = str(Path(sys.executable).with_name("frt-mirror"))

    def settle() -> None:
        """Before each timed run: nothing of the last one left to write out, and the bundle in the page
        cache again (what the runs before wrote can push it out of a memory-limited container's cache):
        dropping the caches needs root, so every run reads the bundle from memory instead."""
        subprocess.run(["sync"], check=True)
        with open(full, "rb") as f:
            while f.read(16 * MiB):
                pass

    commands = {
        "tar": lambda out: ["tar", "-xf", str(full), "-C", str(out)],
        "tar_sync": lambda out: ["sh", "-c", f"tar -xf {full} -C {out} && sync"],
        "import": lambda out: [exe, "--home", str(out), "import", str(full), "--quiet"],
    }
    runs: dict[str, list[float]] = {k: [] for k in commands}
    blobs = 0
    warm = tmp / "warm-up"  # untimed: the command's modules compiled to bytecode, as an install leaves them
    timed(commands["import"](warm), env)
    shutil.rmtree(warm)
    for i in range(RUNS):
        for kind, command in commands.items():
            out = tmp / f"{kind}-{i}"
            if kind.startswith("tar"):
                out.mkdir()
            settle()
            runs[kind].append(timed(command(out), env))
            if kind == "import":
                blobs = sum(1 for p in (out / "store" / "sha256").rglob("*") if p.is_file())
            # Each run's output goes before the next run: on a VM each fresh 362 MiB of page cache cost
            # more than the last (the 4th writer in a row took 1.0 s where the 1st took 0.14 s), so
            # every run writes into the pages the last one freed, whatever its place in the order.
            shutil.rmtree(out)
    return {**{k: statistics.median(v) for k, v in runs.items()}, "blobs": blobs}


def installed_env() -> dict[str, str]:
    """A child's environment: none of ours or huggingface_hub's settings, and bytecode written and read as
    an installed package has it (a shell with PYTHONDONTWRITEBYTECODE=1 would compile every module on
    every run of ours, and of no baseline)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FRT_", "HF_"))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def copiers() -> int:
    from frt.mirror.bundle.extract import copiers

    return copiers()


def hash_seconds(full: Path) -> dict[str, float]:
    """Seconds each hash import must take of every byte (sha256, git's sha1) costs alone, over the bundle's
    bytes already in memory, on one core: the floor under a verified import, whatever it overlaps."""
    import hashlib

    with open(full, "rb") as f:
        chunks = list(iter(lambda: f.read(4 * MiB), b""))
    out = {}
    for name in ("sha256", "sha1"):
        h, t0 = hashlib.new(name), time.perf_counter()
        for c in chunks:
            h.update(c)
        out[name] = time.perf_counter() - t0
    return out


def startup_seconds() -> float:
    """Python start-up and the imports the import command needs, alone (median of RUNS)."""
    env = installed_env()
    code = "import frt.cli, frt.mirror.bundle, frt.resolver.variants"
    return statistics.median(timed([sys.executable, "-c", code], env) for _ in range(RUNS))


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.bundle", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="bench.stage's quick repos at 1/8 size, for tests")
    args = ap.parse_args()
    tmp_dir = tempfile.TemporaryDirectory(prefix="frt-bench-bundle-")
    hub_env("http://unused.invalid", tmp_dir.name)
    with tmp_dir as tmp_name:
        tmp = Path(tmp_name)
        incremental_vs_full(tmp, args.quick)
        sets = {name: make_set(tmp, name, *spec) for name, spec in (QUICK_SETS if args.quick else SETS).items()}
        rows = {name: import_vs_tar(path, tmp) for name, path in sets.items()}
        sizes = {name: path.stat().st_size for name, path in sets.items()}
        biggest = max(sets, key=lambda name: sizes[name])
        hashes, startup = hash_seconds(sets[biggest]), startup_seconds()
    print_import(rows, sizes)
    print_floors(rows[biggest], sizes[biggest], hashes, startup)


def incremental_vs_full(tmp: Path, quick: bool) -> None:
    """The first table: bytes of an incremental bundle beside a full one, for one new kernel version."""
    from frt.mirror.bundle import bundle
    from frt.mirror.store.home import Home
    from tests.support.fakehub import FakeHub

    names, scale = (QUICK_REPOS, QUICK_SCALE) if quick else (tuple(REPOS), 1.0)
    repos = {r.repo_id: r for r in make_repos(names, scale)}
    pairs = [(r, v) for r in repos for v in REPOS[r.split("/")[1]]]
    with FakeHub(list(repos.values()), page_size=1000) as hub:
        home = Home(tmp / "home")
        stage_all(home, hub.url, pairs)
        a = bundle(tmp / "a.tar", home)
        new_bytes = publish_v3(repos["bench-org/activation"], scale)
        stage_all(home, hub.url, pairs + [("bench-org/activation", 3)])
        b = bundle(tmp / "b.tar", home, since=tmp / "a.tar")
        full = bundle(tmp / "full.tar", home)
        home.close()
    size = {k: (tmp / f"{k}.tar").stat().st_size for k in ("a", "b", "full")}
    shutil.rmtree(tmp / "home")
    print(
        f"bundle: {len(repos)} repos, {len(pairs)} requests x {len(TARGETS)} targets staged, then one new "
        f"kernel version,\n  bench-org/activation v3 ({len(NEW)} variants, {new_bytes / MiB:.2f} MiB of new "
        "payload), staged again"
    )
    print(f"\n{'':34} {'file MiB':>9} {'blobs':>6} {'blob MiB':>9}")
    for label, rep, key in (
        ("A: full, before v3", a, "a"),
        ("incremental --since A", b, "b"),
        ("full bundle, after v3", full, "full"),
    ):
        print(f"{label:34} {size[key] / MiB:>9.2f} {rep.blobs:>6} {rep.bytes / MiB:>9.2f}")
    print(
        f"\nbytes ratio incremental/full = {size['b'] / size['full']:.3f} (v3's new payload alone: "
        f"{new_bytes / size['full']:.3f} of the full bundle; the rest of the incremental is v3's small files,\n"
        f"  records and the base's state: {(size['b'] - new_bytes) / 1024:.1f} KiB)",
        flush=True,
    )
    if b.base != a.id:
        print("WARNING: the incremental does not name A as its base")


def print_import(rows: dict[str, dict[str, float]], sizes: dict[str, int]) -> None:
    print(
        f"\nimport vs tar -x: the same bundle, page cache warm (read whole before each run: dropping caches "
        f"needs root), each a child process, median of {RUNS}, runs interleaved; a ratio is tar's seconds / "
        "import's (a speed ratio: 1.00 is as fast as tar)"
    )
    head = ("bundle", "MiB", "blobs", "tar -x s", "tar -x+sync s", "import s", "vs tar -x", "vs tar -x+sync")
    print(f"{head[0]:8} {head[1]:>7} {head[2]:>6} {head[3]:>9} {head[4]:>14} {head[5]:>9} {head[6]:>10} {head[7]:>15}")
    for name, t in rows.items():
        print(
            f"{name:8} {sizes[name] / MiB:>7.1f} {int(t['blobs']):>6} {t['tar']:>9.2f} {t['tar_sync']:>14.2f} "
            f"{t['import']:>9.2f} {t['tar'] / t['import']:>10.2f} {t['tar_sync'] / t['import']:>15.2f}"
        )
    name = max(rows, key=lambda n: sizes[n])
    t = rows[name]
    plain, synced = t["tar"] / t["import"], t["tar_sync"] / t["import"]
    print(
        f"\n{name}: throughput ratio import/(tar -x, then sync) = {synced:.2f} (the same durability; target >= 0.8): "
        f"{'PASS' if synced >= 0.8 else 'FAIL'}"
        f"\n{name}: throughput ratio import/tar -x = {plain:.2f} (target >= 0.5): {'PASS' if plain >= 0.5 else 'FAIL'}"
        "\n  `import` is the whole command (Python start-up, the ledger's creation, the rows and views); it "
        "hashes every byte twice (sha256, git sha1)\n  as read back from the part it copied, fsyncs each part, "
        "and shows nothing until every member verified; tar -x only copies bytes"
    )


def print_floors(t: dict[str, float], size: int, hashes: dict[str, float], startup: float) -> None:
    both = hashes["sha256"] + hashes["sha1"]
    print(
        f"\nfloors, of the {size / MiB:.0f} MiB bundle: the hashes alone, of its bytes in memory, one core each: "
        f"sha256 {hashes['sha256']:.2f} s, sha1 {hashes['sha1']:.2f} s\n  (spread over this box's {copiers()} "
        f"core(s) and nothing else: {both / copiers():.2f} s); Python start-up and the imports the command "
        f"needs: {startup:.2f} s;\n  import's floor here {both / copiers() + startup:.2f} s, beside tar -x "
        f"{t['tar']:.2f} s and tar -x then sync {t['tar_sync']:.2f} s"
    )


if __name__ == "__main__":
    main()
