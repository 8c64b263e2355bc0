"""kill -9 of `import` while it writes: the home stays verify-clean, shows nothing of the bundle (no blob in
the store, no view, no staged row: those appear only once every member verified), and a rerun imports it
whole. The members are big (40 MiB, ten of import's 4 MiB chunks: bundle/extract.py), so a kill lands
inside a member's part, not between members."""

from __future__ import annotations

import hashlib
import json
import random
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.bundles import make_bundle
from tests.support.cli import EXE, X86, cli_env, run_cli, stage_json, write_manifest
from tests.support.fakehub import FakeHub, FakeRepo
from tests.support.homes import part_sizes
from tests.support.kernel_fixtures import ARM_CU, ORG, X86_CPU, build, variant_files

HUGE = f"{ORG}/huge"
MEMBER = 40 << 20


@pytest.fixture(scope="module")
def huge_bundle(tmp_path_factory) -> Path:
    """A bundle of one kernel whose two variants each carry a 40 MiB file (random: nothing compresses)."""
    root = tmp_path_factory.mktemp("huge")
    repo = FakeRepo(HUGE)
    files = build("huge", [], version=1)
    for v in (X86_CPU, ARM_CU):
        extra = {"_huge.abi3.so": hashlib.shake_128(v.encode()).digest(MEMBER)}
        files.update(variant_files("huge", v, version=1, extra=extra))
    repo.commit(files, title="huge", branch="v1")
    m = write_manifest(root / "m.toml", {HUGE: {"version": 1}}, [X86, "torch2.11-cu130-aarch64-linux"])
    with FakeHub([repo], trusted_orgs=[ORG]) as hub:
        p, _ = stage_json(root / "a", m, hub)
        assert p.returncode == 0, p.stderr
    out = root / "huge.tar"
    make_bundle(root / "a", out)
    return out


def _staged_rows(home: Path) -> int:
    if not (home / "ledger.sqlite").exists():
        return 0
    with sqlite3.connect(home / "ledger.sqlite") as db:
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        return db.execute("SELECT count(*) FROM staged").fetchone()[0] if "staged" in tables else 0


def test_kill_9_mid_import_leaves_the_home_verify_clean_and_a_rerun_completes(huge_bundle, tmp_path):
    home = tmp_path / "b"
    rng = random.Random(45)
    mid_part = 0
    for run in range(4):
        proc = subprocess.Popen(
            [EXE, "--home", str(home), "import", str(huge_bundle), "--quiet"],
            env=cli_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        # Wait for a part that has some of its bytes and not all (however long start-up took on a loaded
        # machine: a fixed sleep there lands before the first byte), then let a random few chunks more land.
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            if any(0 < size < MEMBER for size in part_sizes(home, "*.import-*.part").values()):
                break
            time.sleep(0.002)
        time.sleep(rng.uniform(0, 0.02) if run else 0)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL, "the import finished before it was killed"
        partial = any(0 < size < MEMBER for size in part_sizes(home, "*.import-*.part").values())
        mid_part += partial
        if partial:  # nothing of the bundle is visible until every member verified
            assert not [p for p in (home / "store").rglob("*") if p.is_file()]
            assert not (home / "views").exists() or not [p for p in (home / "views").rglob("*") if p.is_file()]
            assert _staged_rows(home) == 0
        v = run_cli("verify", "--json", home=home)
        assert v.returncode == 0, v.stdout + v.stderr
    assert mid_part >= 2, "the kills should land inside a member's part, not before or after the copy"
    p = run_cli("import", str(huge_bundle), "--json", home=home)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["new_rows"] == 2 and doc["bytes"] > 2 * MEMBER
    v = run_cli("verify", "--json", home=home)
    assert v.returncode == 0 and json.loads(v.stdout)["blobs"] == doc["blobs"], v.stdout
