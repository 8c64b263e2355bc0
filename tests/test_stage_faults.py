"""Stage under a hostile world: a flaky upstream, a tampered file, kill -9 at any moment, two stagers
at once, and damage after the fact that `verify` must find."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.big_kernel import BIG
from tests.support.cli import X86, cli_env, run_cli
from tests.support.homes import part_sizes
from tests.support.kernel_fixtures import ORG, X86_CPU


def stage_cli(home, manifest, hub, **env):
    return run_cli("--endpoint", hub.url, "stage", str(manifest), "--json", home=home, env=cli_env(**env))


def store_blobs(home: Path) -> dict[str, int]:
    root = home / "store" / "sha256"
    return {p.name: p.stat().st_size for p in root.glob("??/*")} if root.exists() else {}


def assert_views_only_link_verified_blobs(home: Path) -> None:
    """Every file a view shows is a hard link to a complete blob: never a partial download."""
    views = home / "views" / "local"
    for p in views.rglob("*") if views.exists() else []:
        if p.is_file():
            assert p.stat().st_nlink >= 2, f"{p} is not a link into the store"
            assert any(
                os.path.samefile(p, b)
                for b in (home / "store" / "sha256").glob("??/*")
                if b.stat().st_ino == p.stat().st_ino
            ), p


def test_flaky_upstream_503_bursts_and_dropped_connections(big_hub, home, big_manifest):
    big_hub.faults.fail_next(6, status=503, match="/resolve/")
    big_hub.faults.fail_next(2, status=502, match="/tree/")
    big_hub.faults.drop_after("_big_2", nbytes=300_000, times=2)
    big_hub.faults.drop_after("_big_0", nbytes=10, times=1)
    p = stage_cli(home, big_manifest, big_hub)
    assert p.returncode == 0, p.stderr
    statuses = [s for _, path, s in big_hub.requests if "/resolve/" in path]
    assert statuses.count(503) == 6
    assert run_cli("verify", home=home).returncode == 0
    assert_views_only_link_verified_blobs(home)


def test_upstream_dying_mid_stage_is_one_line_and_keeps_what_is_stored(big_hub, home, big_manifest):
    big_hub.faults.throttle("/resolve/", 4e6)
    exe = str(Path(sys.executable).with_name("frt-mirror"))
    proc = subprocess.Popen(
        [exe, "--home", str(home), "--endpoint", big_hub.url, "stage", str(big_manifest)],
        env=cli_env(FRT_RETRY_ATTEMPTS="2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Kill the upstream while bodies are arriving on several connections (not after a fixed sleep,
    # which on a loaded machine lands before the first byte). Those kept-alive connections are what a
    # stop that only closes the listening socket leaves serving: the stage then completes.
    assert big_hub.wait_for_body(n=4, timeout=60), "the stage never had four downloads in flight"
    assert proc.poll() is None
    big_hub.stop()  # severs the open connections too, as a dead host does
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err  # upstream unavailable: try again later
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("frt-mirror: ") and "Traceback" not in err
    assert not any(p.name.endswith(".part") for p in (home / "store").rglob("*"))
    assert_views_only_link_verified_blobs(home)
    v = run_cli("verify", home=home)
    assert v.returncode == 0, v.stdout


def test_tampered_upstream_file_is_refused_recorded_and_not_stored(big_hub, home, big_manifest):
    repo = big_hub.repos[("kernel", BIG)]
    head = repo.branches["v1"]
    path = f"build/{X86_CPU}/_big_1.abi3.so"
    evil = bytearray(repo.commits[head].files[path])
    evil[1000] ^= 0xFF
    repo.set_file_bytes(head, path, bytes(evil))
    p = stage_cli(home, big_manifest, big_hub)
    assert p.returncode == 1
    rows = json.loads(p.stdout)["rows"]
    bad = [r for r in rows if r["status"] != "staged"]
    # The tampered blob is shared by every variant of the repo: each staging of it is refused.
    assert {r["repo"] for r in bad} == {BIG} and all(r["status"] == "refused" for r in bad)
    assert "upstream advertised sha256" in bad[0]["detail"]
    assert any(r["repo"] == f"{ORG}/relu" and r["status"] == "staged" for r in rows)
    import hashlib

    assert hashlib.sha256(evil).hexdigest() not in store_blobs(home)
    assert not list((home / "tmp").glob("*.part"))
    report = json.loads(run_cli("report", "--json", home=home).stdout)
    assert {r["error"] for r in report} == {"IntegrityMismatch"}
    assert "served sha256" in report[0]["detail"]
    assert run_cli("verify", home=home).returncode == 0


def test_kill_9_at_random_moments_then_rerun_completes(big_hub, home, big_manifest):
    # ~13 MB over up to 8 connections at 200 kB/s each: ~8 s of downloading in all, so the ten killed
    # runs do not finish the stage between them (at 1 MB/s a loaded machine saw it done by run 4).
    big_hub.faults.throttle("/resolve/", 2e5)
    exe = str(Path(sys.executable).with_name("frt-mirror"))
    cmd = [exe, "--home", str(home), "--endpoint", big_hub.url, "stage", str(big_manifest), "--json"]
    rng = random.Random(7)
    killed_mid_file = 0

    for run in range(10):
        before = part_sizes(home)
        proc = subprocess.Popen(cmd, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if run % 2:
            # Odd runs: kill while a body is arriving, however long imports and the scan took on a
            # loaded machine (a fixed sleep there lands before the first byte).
            deadline = time.monotonic() + 60
            while (
                proc.poll() is None
                and time.monotonic() < deadline
                and not any(size > before.get(name, 0) for name, size in part_sizes(home).items())
            ):
                time.sleep(0.02)
            time.sleep(rng.uniform(0, 0.3))
        else:
            time.sleep(rng.uniform(0.3, 3.5))  # anywhere: during imports, the scan, or a download
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        killed_mid_file += any(p.stat().st_size > 0 for p in (home / "tmp").glob("*.part"))
        assert_views_only_link_verified_blobs(home)
    assert killed_mid_file >= 3, "the kills should land inside downloads, not only before or after"
    big_hub.faults.clear()
    p = stage_cli(home, big_manifest, big_hub)
    assert p.returncode == 0, p.stderr
    v = run_cli("verify", "--json", home=home)
    assert v.returncode == 0, v.stdout
    assert_views_only_link_verified_blobs(home)
    doc = json.loads(p.stdout)
    assert doc["downloaded_bytes"] < doc["needed_bytes"], "the rerun resumes: it never starts from zero"
    assert_bundle_round_trips(home, home.parent)


def assert_bundle_round_trips(home: Path, tmp: Path) -> None:
    """What was stored by killed or racing runs bundles, imports and verifies: every blob's recorded
    git oid is its content's (an LFS file's listing names its pointer's)."""
    tar = tmp / "after.tar"
    b = run_cli("bundle", str(tar), home=home)
    assert b.returncode == 0, b.stderr
    i = run_cli("import", str(tar), home=tmp / "imported")
    assert i.returncode == 0, i.stderr
    assert run_cli("verify", home=tmp / "imported").returncode == 0


def test_three_stagers_on_one_home_at_once(big_hub, home, big_manifest):
    """Started together on a fresh home: they race to create the same ledger rows and blobs."""
    big_hub.faults.throttle("/resolve/", 20e6)
    exe = str(Path(sys.executable).with_name("frt-mirror"))
    cmd = [exe, "--home", str(home), "--endpoint", big_hub.url, "stage", str(big_manifest), "--json"]
    procs = [
        subprocess.Popen(cmd, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=180) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
    total = sum(json.loads(out)["downloaded_bytes"] for out, _ in outs)
    needed = json.loads(outs[0][0])["needed_bytes"]
    assert total <= needed * 1.05, "the per-blob lock lets one stager fetch, the other reuse"
    assert run_cli("verify", home=home).returncode == 0
    rows = json.loads(run_cli("env", "--target", X86, "--format", "json", home=home).stdout)["kernels"]
    assert {r["repo"] for r in rows} == {BIG, f"{ORG}/relu"}
    assert_bundle_round_trips(home, home.parent)


def test_verify_finds_a_corrupt_blob_and_a_broken_view(big_hub, home, big_manifest):
    assert stage_cli(home, big_manifest, big_hub).returncode == 0
    blobs = sorted((home / "store" / "sha256").glob("??/*"), key=lambda p: p.stat().st_size)
    victim = blobs[-1]
    os.chmod(victim, 0o644)
    with open(victim, "r+b") as f:
        f.seek(5)
        f.write(b"X")
    view_file = next((home / "views" / "local").rglob("__init__.py"))
    view_file.unlink()
    p = run_cli("verify", "--json", home=home)
    assert p.returncode == 1
    problems = json.loads(p.stdout)["problems"]
    assert any(victim.name in x and "corrupt blob" in x for x in problems)
    assert any(str(view_file) in x and "missing" in x for x in problems)
    human = run_cli("verify", home=home)
    assert human.returncode == 1 and "problem(s)" in human.stdout


def test_blobs_stored_but_not_recorded_are_recorded_with_their_own_git_oid(big_hub, home, big_manifest):
    """A run killed between storing a blob and recording it: the rerun finds the blob in the store and
    must record the content's git oid, not the LFS pointer's oid from the listing."""
    import sqlite3

    assert stage_cli(home, big_manifest, big_hub).returncode == 0
    with sqlite3.connect(home / "ledger.sqlite") as db:
        db.execute("DELETE FROM blobs")
    assert stage_cli(home, big_manifest, big_hub).returncode == 0
    assert_bundle_round_trips(home, home.parent)
