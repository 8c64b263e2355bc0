"""unstage and gc, as an operator runs them: what is freed is exactly what nothing references, the
home stays sound (verify), what is still staged still loads in the real `kernels`, and a gc that
meets a running stage never takes a blob from under it (both run for real, against the fake Hub)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from frt.mirror.events import last_events
from frt.mirror.store.gc import SWEEP_AGE_S, plan
from frt.mirror.store.home import Home
from frt.mirror.store.records import all_blobs
from tests.support.cli import X86, cli_env, one_line, run_cli, stage_json, write_manifest
from tests.support.fakehub.repo import sha256
from tests.support.kernel_fixtures import ACTIVATION, RELU, X86_CPU
from tests.support.offline import load_offline, read_only
from tests.support.stage_race import stage_gc_race, wait_for

EXE = str(Path(sys.executable).with_name("frt-mirror"))
X86_212 = "torch2.12-cpu-x86_64-linux"  # no torch2.12 build: it takes the noarch torch-cpu variant


def variant_blobs(hub, repo: str, branch: str, variant: str) -> set[str]:
    """The sha256 of the files of a variant at a branch's head, from the upstream's own bytes."""
    r = hub.repos[("kernel", repo)]
    files = r.commits[r.branches[branch]].files
    return {sha256(data) for path, data in files.items() if data is not None and path.startswith(f"build/{variant}/")}


def store_blobs(home: Path) -> set[str]:
    return {p.name for p in (home / "store" / "sha256").glob("??/*")}


def recorded(home: Path) -> set[str]:
    h = Home(home)
    try:
        return {d.sha256 for d in all_blobs(h.ledger)}
    finally:
        h.close()


def cli_json(*args: str, home: Path, code: int = 0) -> dict:
    p = run_cli(*args, "--json", home=home)
    assert p.returncode == code, p.stderr
    return json.loads(p.stdout)


def verify_clean(home: Path) -> dict:
    doc = cli_json("verify", home=home)
    assert doc["ok"] and not doc["problems"] and doc["adopted"] == 0, doc
    return doc


def loads(home: Path, target: str, code: str) -> str:
    """`code` in a subprocess with no network, LOCAL_KERNELS from `env --target`: the real kernels."""
    env = json.loads(run_cli("env", "--target", target, "--format", "json", home=home).stdout)["env"]
    out = load_offline(code, env)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def two_targets(hub, home: Path, tmp_path: Path) -> Path:
    """Stage activation v1 and relu v1 for this machine and for torch 2.12, where activation's
    torch-cpu variant shares its compiled .so with the torch 2.13 one."""
    m = write_manifest(tmp_path / "m.toml", {ACTIVATION: {"version": 1}, RELU: {"version": 1}}, [X86, X86_212])
    p, _ = stage_json(home, m, hub)
    assert p.returncode == 0, p.stderr
    return home


def test_unstage_then_gc_frees_exactly_the_unreferenced_blobs(ledger_each, hub, home, tmp_path):
    """On SQLite in the home and on PostgreSQL (FRT_LEDGER_URL), as the race below."""
    home = two_targets(hub, home, tmp_path)
    x86 = variant_blobs(hub, ACTIVATION, "v1", X86_CPU)
    noarch = variant_blobs(hub, ACTIVATION, "v1", "torch-cpu")
    shared = x86 & noarch
    assert len(shared) == 1 and x86 - noarch  # the .so: what a still-staged set keeps alive
    before = store_blobs(home)
    assert x86 | noarch <= before
    assert cli_json("gc", "--dry-run", home=home)["removed_blobs"] == 0  # all staged: nothing to free

    out = cli_json("unstage", f"{ACTIVATION}@v1", "--target", X86, home=home)
    assert [(r["repo"], r["requested"], r["target"]) for r in out["rows"]] == [(ACTIVATION, "v1", X86)]
    assert len(out["views"]) == 1 and not Path(out["views"][0]).exists()
    assert out["reclaimable_blobs"] == len(x86 - noarch)
    assert out["reclaimable_bytes"] == sum((home / "store" / "sha256" / s[:2] / s).stat().st_size for s in x86 - noarch)
    verify_clean(home)  # no staged row names the removed view; nothing dangles

    dry = cli_json("gc", "--dry-run", home=home)
    assert dry["dry_run"] and {b["sha256"] for b in dry["blobs"]} == x86 - noarch
    assert store_blobs(home) == before and recorded(home) == before  # dry: nothing removed

    done = cli_json("gc", home=home)
    assert {b["sha256"] for b in done["blobs"]} == x86 - noarch
    assert done["removed_bytes"] == dry["removed_bytes"] == out["reclaimable_bytes"]
    h = Home(home)
    try:  # the operator's page shows the last gc
        gc_event = last_events(h.ledger)["gc"]
    finally:
        h.close()
    assert (gc_event.files, gc_event.nbytes) == (len(x86 - noarch), done["removed_bytes"])
    assert store_blobs(home) == before - (x86 - noarch) == recorded(home)
    assert shared <= store_blobs(home)
    verify_clean(home)
    assert cli_json("gc", home=home)["removed_blobs"] == 0
    # What is still staged loads: activation v1 for torch 2.12 (through the shared .so's blob), and relu.
    assert loads(
        home,
        X86_212,
        f"""
        import kernels
        a, r = kernels.get_kernel({ACTIVATION!r}, version=1), kernels.get_kernel({RELU!r}, version=1)
        print(a.VARIANT, a.add(2, 3), r.VARIANT)
    """,
    ).split() == ["torch-cpu", "5", "torch-universal"]
    human = run_cli("unstage", RELU, home=home)
    assert human.returncode == 0 and "unstaged 2 row(s); removed 2 view(s)" in human.stdout, human.stderr
    assert "gc' can now reclaim" in human.stdout
    human = run_cli("gc", home=home)
    assert human.returncode == 0 and human.stdout.startswith("removed ") and "unreferenced blob(s)" in human.stdout
    assert not (home / "views" / "local" / "kernels-test--relu").exists()  # its empty folders went too
    verify_clean(home)


def test_a_view_two_requests_share_goes_with_the_last_of_them(hub, home, tmp_path):
    m = write_manifest(tmp_path / "m.toml", {ACTIVATION: {"version": 1}}, [X86])
    assert stage_json(home, m, hub)[0].returncode == 0
    m2 = write_manifest(tmp_path / "m2.toml", {ACTIVATION: {"revision": "release/v1"}}, [X86])
    assert stage_json(home, m2, hub)[0].returncode == 0  # the same commit and variant: one view
    blobs = variant_blobs(hub, ACTIVATION, "v1", X86_CPU)

    out = cli_json("unstage", f"{ACTIVATION}@v1", home=home)
    assert [r["requested"] for r in out["rows"]] == ["v1"]
    assert out["views"] == [] and out["reclaimable_blobs"] == 0
    env = json.loads(run_cli("env", "--target", X86, "--format", "json", home=home).stdout)["env"]
    assert Path(env["LOCAL_KERNELS"].split("=", 1)[1], "__init__.py").is_file()  # still there for release/v1
    out = cli_json("unstage", f"{ACTIVATION}@release/v1", home=home)
    assert len(out["views"]) == 1 and out["reclaimable_blobs"] == len(blobs)
    assert {b["sha256"] for b in cli_json("gc", home=home)["blobs"]} == blobs
    assert store_blobs(home) == set() == recorded(home)
    assert not (home / "views" / "local" / "kernels-test--activation").exists()
    verify_clean(home)


def test_gc_sweeps_dead_partial_downloads_and_records_of_missing_blobs(hub, home, tmp_path):
    home = two_targets(hub, home, tmp_path)
    tmp = home / "tmp"
    old, young = tmp / f"{'a' * 64}.part", tmp / f"{'b' * 40}.part"
    old.write_bytes(b"x" * 1000)
    young.write_bytes(b"y" * 10)
    past = time.time() - SWEEP_AGE_S - 60
    os.utime(old, (past, past))  # a fetch that died long ago; the young one may be resumed
    cli_json("unstage", RELU, home=home)
    gone = sorted(variant_blobs(hub, RELU, "v1", "torch-universal") | variant_blobs(hub, RELU, "v1", X86_CPU))
    lost = home / "store" / "sha256" / gone[0][:2] / gone[0]
    lost.unlink()  # a blob lost by hand: its record claims bytes the store lacks
    # ... bytes nothing references (relu is unstaged), as a gc cut short between removing a blob and its
    # record leaves them: a stale record, not a problem (gc drops it below)
    v = cli_json("verify", home=home)
    assert v["ok"] and v["stale_records"] == 1, v

    dry = cli_json("gc", "--dry-run", home=home)
    assert [p["name"] for p in dry["parts"]] == [old.name] and dry["part_bytes"] == 1000
    assert dry["dropped_records"] == 1 and old.exists()
    done = cli_json("gc", home=home)
    assert {b["sha256"] for b in done["blobs"]} == set(gone[1:]) and done["dropped_records"] == 1
    assert not old.exists() and young.exists()
    verify_clean(home)


def test_bad_input_is_one_line_and_exit_2(hub, home, tmp_path):
    home = two_targets(hub, home, tmp_path)
    cases = {
        (f"{ACTIVATION}@v7",): "nothing staged matches it; staged: v1",
        ("kernels-test/nothing",): "kernels-test/nothing is not staged",
        (ACTIVATION, "--target", "torch2.11-cu130-aarch64-linux"): "nothing staged matches it for torch2.11",
        (ACTIVATION, "--target", "tpu"): "target",
        ("no-slash",): "malformed repo id",
        (f"{ACTIVATION}@",): "expected REPO or REPO@REV",
    }
    for args, text in cases.items():
        p = run_cli("unstage", *args, home=home)
        assert p.returncode == 2 and text in one_line(p), (args, p.stderr)
    p = run_cli("gc", home=tmp_path / "nowhere")
    assert p.returncode == 2 and "no frt-mirror home at" in one_line(p)
    assert not (tmp_path / "nowhere").exists()
    assert len(cli_json("verify", home=home)["problems"]) == 0  # nothing was dropped on the way


def test_a_read_only_home_is_refused_in_one_line(hub, home, tmp_path):
    home, ro = two_targets(hub, home, tmp_path), tmp_path / "ro"
    ro.mkdir()
    before = store_blobs(home)
    for args in (["gc"], ["gc", "--dry-run"], ["unstage", ACTIVATION]):
        p = read_only(home, ro, "exec " + " ".join([EXE, "--home", str(ro), *args]))
        assert p.returncode == 2 and "read-only" in one_line(p), (args, p.stderr)
    assert store_blobs(home) == before and len(cli_json("unstage", ACTIVATION, home=home)["rows"]) == 2


def test_gc_racing_a_stage_never_takes_a_blob_from_under_it(ledger_each, hub, home, tmp_path):
    old = write_manifest(tmp_path / "old.toml", {ACTIVATION: {"version": 1}}, [X86])
    assert stage_json(home, old, hub)[0].returncode == 0
    v1 = hub.repos[("kernel", ACTIVATION)].branches["v1"]
    assert [r["commit"] for r in cli_json("unstage", f"{ACTIVATION}@{v1[:8]}", home=home)["rows"]] == [v1]
    garbage = variant_blobs(hub, ACTIVATION, "v1", X86_CPU)
    new = variant_blobs(hub, ACTIVATION, "v2", X86_CPU)
    assert garbage and new and not garbage & new

    # The stage of v2 stores its small files, then sits in the middle of the .so's body until released.
    hub.faults.hold("_activation.abi3.so", 4096)
    m = write_manifest(tmp_path / "new.toml", {ACTIVATION: {"version": 2}}, [X86])
    with stage_gc_race(hub, tmp_path, cli_env()) as race:
        race.stage("--home", str(home), "--endpoint", hub.url, "stage", str(m), "--json")
        small = wait_for("the stage to store its small files", lambda: (store_blobs(home) & new) or None)
        # The window: stored, not yet staged. Without the store's lock gc would take these.
        h = Home(home)
        try:
            assert small <= {d.sha256 for d in plan(h).garbage}
        finally:
            h.close()
        race.gc("--home", str(home), "gc", "--json")
        assert race.collector.poll() is None and small <= store_blobs(home)
        race.finish()
    done = race.gc_json()
    assert {b["sha256"] for b in done["blobs"]} == garbage  # the old set, and nothing of the new
    assert new <= store_blobs(home) == recorded(home)
    assert all(r["status"] == "staged" for r in race.stage_json()["rows"])
    verify_clean(home)
    assert (
        loads(
            home,
            X86,
            f"""
        import kernels; k = kernels.get_kernel({ACTIVATION!r}, version=2); print(k.VARIANT, k.REVISION_NOTE)
    """,
        )
        == f"{X86_CPU} v2.1"
    )
