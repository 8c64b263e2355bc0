"""On a full disk, the commands that read or free space still work (issue 49): the home staged on a small
tmpfs (inside `unshare -m`), then filled to its last byte by another writer. verify, report, env, matrix and
export-cache answer and write nothing in the home; gc and unstage free space before they write anything,
and leave the home verify-clean."""

from __future__ import annotations

import json

from tests.support.big_kernel import BIG
from tests.support.cli import ARM_CU, X86, write_manifest
from tests.support.full_disk import number, ok_json, run_full, said
from tests.support.kernel_fixtures import RELU, X86_CPU

MIB = 1 << 20


def big_and_relu(tmp_path):
    """`big` (about 13 MB for the two targets) and relu, as tests/test_stage_disk.py stages them."""
    return write_manifest(tmp_path / "m.toml", {BIG: {"version": 1}, RELU: {"version": 1}}, [X86, ARM_CU])


def test_reading_commands_answer_on_a_full_disk_and_write_nothing_in_the_home(big_hub, tmp_path):
    """Each reading command exits 0 with the right answer, and the home's listing (every path, size and
    mtime) is the same after them as before. An unstage that cannot make room is refused before it touches
    anything (exit 4), and the listing is still the same."""
    script = """
run stage stage "$M"
fill
free free0
listing before
run verify verify --json
run verify_text verify
run report report --json
run env env --target "$X86" --format json
run matrix matrix "$BIG"
run export export-cache "$OUT/cache" --target "$X86" --json
listing after
run unstage unstage "$RELU"
listing after_unstage
run verify_after verify --json
"""
    out = run_full(tmp_path, big_hub, "24m", script, M=str(big_and_relu(tmp_path)), X86=X86, BIG=BIG, RELU=RELU)
    assert said(out, "stage")[0] == 0, said(out, "stage")
    assert number(out, "free0") == 0, "the disk is full"
    home = tmp_path / "disk" / "home"

    v = ok_json(out, "verify")
    assert v["ok"] and v["blobs"] >= 8 and v["view_files"] > 0, v
    assert v["readonly"] and v["disk_full"] and v["adopted"] == 0 and v["stale_records"] == 0, v
    rc, text, _ = said(out, "verify_text")
    assert rc == 0 and "note: the home's disk is full: verify reported only and adopted nothing" in text, text

    assert isinstance(ok_json(out, "report"), list)
    local = ok_json(out, "env")["env"]["LOCAL_KERNELS"]
    assert f"{BIG}={home}/views/local/" in local and f"{RELU}={home}/views/local/" in local, local
    rc, text, err = said(out, "matrix")
    assert rc == 0 and X86_CPU in text and ARM_CU.replace("2.11", "211") not in err, (text, err)
    refs = {(r["repo"], r["ref"]) for r in ok_json(out, "export")["refs"]}
    assert refs == {(BIG, "v1"), (RELU, "v1")}, refs
    assert list((out / "cache").rglob("*.so")), "the exported cache holds the files"

    before = (out / "before").read_text()
    assert before == (out / "after").read_text(), "the reading commands wrote nothing in the home"

    rc, _, lines = said(out, "unstage")
    assert rc == 4 and len(lines) == 1 and "nothing was unstaged" in lines[0], lines
    assert before == (out / "after_unstage").read_text(), "a refused unstage touched nothing"
    assert ok_json(out, "verify_after")["ok"]


def test_gc_and_unstage_free_space_on_a_full_disk_before_they_write(big_hub, tmp_path):
    """relu unstaged while there is room; the disk filled. gc removes relu's blobs (a few kB, not enough to
    write the ledger: its rows wait, said), and verify is clean. Filled again, unstaging big removes its
    views and blobs first, then its rows: megabytes free, verify clean; the next gc drops the records."""
    script = """
run stage stage "$M"
run unstage0 unstage "$RELU" --json
fill
free free0
run gc1 gc --json
free free1
run verify1 verify --json
run verify1_text verify
fill
run unstage1 unstage "$BIG" --json
free free2
run verify2 verify --json
run gc2 gc --json
run verify3 verify --json
"""
    out = run_full(tmp_path, big_hub, "24m", script, M=str(big_and_relu(tmp_path)), BIG=BIG, RELU=RELU)
    assert said(out, "stage")[0] == 0, said(out, "stage")
    relu = ok_json(out, "unstage0")["reclaimable_blobs"]
    assert relu > 0 and number(out, "free0") == 0

    gc1 = ok_json(out, "gc1")
    assert gc1["removed_blobs"] == relu and gc1["ledger_deferred"], gc1
    assert 0 < number(out, "free1") < MIB
    v1 = ok_json(out, "verify1")
    assert v1["ok"] and v1["disk_full"] and v1["stale_records"] == relu, v1
    assert "the next gc drops them" in said(out, "verify1_text")[1]

    un = ok_json(out, "unstage1")
    assert {r["repo"] for r in un["rows"]} == {BIG} and len(un["rows"]) == 2, un
    big = un["freed_blobs"]  # every blob of big's two variants: nothing else needs them
    assert big >= 8 and un["freed_bytes"] > 12 * MIB and len(un["views"]) == 2, un
    assert number(out, "free2") > 12 * MIB
    v2 = ok_json(out, "verify2")
    assert v2["ok"] and not v2["readonly"] and v2["stale_records"] == relu + big, v2

    gc2 = ok_json(out, "gc2")
    assert gc2["dropped_records"] == relu + big and not gc2["ledger_deferred"], gc2
    v3 = ok_json(out, "verify3")
    assert v3["ok"] and v3["stale_records"] == 0 and v3["blobs"] == 0, v3


def test_gc_on_a_full_disk_removes_dead_parts_of_any_age_but_not_a_live_one(big_hub, tmp_path):
    """A stage killed moments ago left its .part files (young: gc keeps those for 10 minutes where there is
    room, to be resumed). On a full disk gc removes every part whose download lock is free, and keeps the
    one a live download holds."""
    dead, live = "a" * 64, "b" * 64
    script = f"""
run stage stage "$M"
dd if=/dev/zero of="$HOMEDIR/tmp/{dead}.part" bs=1M count=3 2>/dev/null
dd if=/dev/zero of="$HOMEDIR/tmp/{live}.part" bs=1k count=8 2>/dev/null
flock "$HOMEDIR/locks/{live}.lock" sh -c 'touch "$OUT/held"; while [ ! -e "$OUT/go" ]; do sleep 0.05; done' &
while [ ! -e "$OUT/held" ]; do sleep 0.02; done
fill
run gc gc --json
touch "$OUT/go"; wait
free free1
ls -A "$HOMEDIR/tmp" >"$OUT/tmp"
run verify verify --json
"""
    out = run_full(tmp_path, big_hub, "24m", script, M=str(big_and_relu(tmp_path)))
    assert said(out, "stage")[0] == 0, said(out, "stage")
    gc = ok_json(out, "gc")
    assert [p["name"] for p in gc["parts"]] == [f"{dead}.part"] and gc["part_bytes"] == 3 * MIB, gc
    assert not gc["ledger_deferred"], gc
    assert (out / "tmp").read_text().split() == [f"{live}.part"]
    assert number(out, "free1") >= 3 * MIB
    assert ok_json(out, "verify")["ok"]


def test_a_ledger_error_for_a_full_disk_is_a_disk_error(big_hub, tmp_path):
    """A command that writes (scan) on a full disk: one line, exit 4, the disk named, not a corrupt ledger."""
    script = """
run stage stage "$M"
fill
run scan scan "$RELU"
"""
    out = run_full(tmp_path, big_hub, "24m", script, M=str(big_and_relu(tmp_path)), RELU=RELU)
    rc, _, lines = said(out, "scan")
    assert rc == 4 and len(lines) == 1 and "a local disk error" in lines[0], lines
    assert json.dumps(lines).count("corrupt") == 0
