"""`frt-mirror stage` of a model repo holds the same memory whatever the size of its files: each file
streams from the socket through the running hashes into its `.part` (mirror/stage/transport.py,
mirror/store/blobs.py) and is renamed into the store, never held whole. Measured as the CLI process's own
max RSS (tests/support/rss.py) for a repo with one 64 MiB shard and one with a 512 MiB shard, served by
the fake Hub from files on disk (tests/support/big_model.py). bench/stage_rss.py runs it at 5 GiB."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support.big_model import MiB, big_model_repo
from tests.support.cli import EXE, cli_env
from tests.support.fakehub import FakeHub
from tests.support.rss import run_measured

FLAT = 32 * MiB  # 8x the bytes may cost this much more peak RSS: a file held whole would cost 448 MiB more
MAX_RSS = 300 * MiB  # README's bound for a stage of any size
GUARD_AS = 3 << 30  # the CLI's address-space ceiling, so a regression cannot take the machine's memory


def peak_rss(tmp: Path, mib: int) -> int:
    """The stager's max RSS for a model repo of one `mib` MiB shard and small config files."""
    where = tmp / f"m{mib}"
    where.mkdir()
    with big_model_repo(f"acme/m{mib}", [mib * MiB], where) as repo, FakeHub([repo]) as hub:
        manifest = where / "m.toml"
        manifest.write_text(f'[models]\n"acme/m{mib}" = {{ revision = "main" }}\n')
        argv = [EXE, "--home", str(where / "home"), "--endpoint", hub.url, "stage", str(manifest), "--json"]
        run = run_measured(argv, cli_env(), timeout=300, guard_as=GUARD_AS)
    shutil.rmtree(where)
    assert run.returncode == 0, run.stderr[-3000:]
    [row] = json.loads(run.stdout)["rows"]
    assert row["status"] == "staged" and row["files"] == 6 and row["bytes"] > mib * MiB, row
    return run.max_rss


@pytest.mark.slow
def test_stage_peak_rss_is_flat_in_the_file_size(tmp_path):
    small, big = peak_rss(tmp_path, 64), peak_rss(tmp_path, 512)
    assert big - small < FLAT and big < MAX_RSS, f"max RSS {small >> 20} MiB (64 MiB file), {big >> 20} MiB (512 MiB)"
