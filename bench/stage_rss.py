"""Peak RSS of `frt-mirror stage` for a 5 GiB model repo, beside a 50 MiB one: memory flat in the file size.

    python -m bench.stage              # this row is printed after the staging table (~75 s of the run)
    python -m bench.stage_rss [--quick]  # this row alone; --quick: a 512 MiB repo instead of 5 GiB (~15 s)

Each model is a repo of safetensors shards (4 of 1.25 GiB, or 1 of 50 MiB; tests/support/big_model.py) and
5 small config files, written to disk here and served by the fake Hub from the page cache (an mmap: the
upstream holds none of it in its heap, and its memory is not what is measured). The stager is the installed
`frt-mirror stage` console script on a fresh home (filesystem store, --jobs 8, its default); its peak RSS is
its own max RSS from wait4 (tests/support/rss.py: a small launcher forks it, not this process, whose size a
fork would carry into the count). No simulated WAN: the bytes come as fast as loopback and the disk take
them, which is when a buffer that grows with the file would show.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from tests.support.big_model import MiB, big_model_repo
from tests.support.cli import cli_env
from tests.support.fakehub import FakeHub
from tests.support.rss import run_measured

GiB = 1024 * MiB
BIG, SMALL = [5 * GiB // 4] * 4, [50 * MiB]
QUICK_BIG = [512 * MiB]
MAX_RSS = 300 * MiB  # the target (issue 45)
FLAT = 32 * MiB  # "flat": the big repo's peak within this of the small one's


def stage_model(shards: list[int], tmp: Path, name: str) -> tuple[int, float, int]:
    """Stage a fresh model repo of `shards` (tensor bytes each): (peak RSS, wall s, bytes staged). Its
    files and the home are removed after."""
    where = tmp / name
    where.mkdir()
    try:
        with big_model_repo(f"bench-org/{name}", shards, where) as repo, FakeHub([repo]) as hub:
            manifest = where / "models.toml"
            manifest.write_text(f'[models]\n"bench-org/{name}" = {{ revision = "main" }}\n')
            exe = str(Path(sys.executable).with_name("frt-mirror"))
            argv = [exe, "--home", str(where / "home"), "--endpoint", hub.url, "stage", str(manifest), "--json"]
            run = run_measured(argv, cli_env(HF_HOME=str(where / "hf")), timeout=900)
    finally:
        shutil.rmtree(where)
    if run.returncode:
        sys.exit(f"frt-mirror stage of {name} failed ({run.returncode}):\n{run.stderr[-3000:]}")
    [row] = json.loads(run.stdout)["rows"]
    if row["status"] != "staged":
        sys.exit(f"frt-mirror stage of {name}: {row}")
    return run.max_rss, run.seconds, row["bytes"]


def main(quick: bool = False) -> None:
    big = QUICK_BIG if quick else BIG
    with tempfile.TemporaryDirectory(prefix="frt-bench-stage-rss-") as tmp:
        small_rss, small_s, small_bytes = stage_model(SMALL, Path(tmp), "model-small")
        big_rss, big_s, big_bytes = stage_model(big, Path(tmp), "model-big")
    label = f"{big_bytes / GiB:.0f} GiB" if big_bytes >= GiB else f"{big_bytes / MiB:.0f} MiB"
    big_mib, small_mib = round(big_rss / MiB), round(small_rss / MiB)
    print(f"stage a {label} model repo: peak RSS {big_mib} MiB ({small_bytes / MiB:.0f} MiB model: {small_mib} MiB)")
    print(
        f"  {len(big)} safetensors shard(s) of {big[0] / MiB:.0f} MiB + 5 config files, {big_bytes:,} B, staged in "
        f"{big_s:.1f} s ({big_bytes / MiB / big_s:.0f} MiB/s; the {small_bytes / MiB:.0f} MiB repo in {small_s:.1f} s)"
        "\n  from the fake Hub on loopback into the filesystem store, --jobs 8; peak RSS: the frt-mirror process's "
        "own max RSS (wait4)"
    )
    ok = big_rss <= MAX_RSS and big_rss - small_rss <= FLAT
    print(
        f"peak RSS {big_mib} MiB (target <= {MAX_RSS // MiB}), {big_mib - small_mib:+d} MiB for "
        f"{big_bytes / small_bytes:.0f}x the bytes (flat: <= {FLAT // MiB:+d}): {'PASS' if ok else 'FAIL'}"
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m bench.stage_rss", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a 512 MiB repo instead of 5 GiB")
    main(ap.parse_args().quick)
