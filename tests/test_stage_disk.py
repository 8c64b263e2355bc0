"""A full disk is a fault, not an outage: the home on a small tmpfs (mounted inside `unshare -m`, so CI's
root mounts nothing outside the test), a stage that cannot fit refused before its first byte, a disk filled
mid-stage by a second writer, and the same stage once the disk has grown."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.big_kernel import BIG
from tests.support.full_disk import said as said_full
from tests.support.full_disk import start_full


def in_tmpfs(tmp_path: Path, hub, manifest: Path, size: str, script: str) -> tuple[subprocess.Popen, Path, Path]:
    """`script` on a `size` tmpfs home (tests/support/full_disk.py), the manifest in $M."""
    return start_full(tmp_path, hub, size, script, M=str(manifest))


def said(out: Path, name: str) -> tuple[int, list[str]]:
    """A step's exit code and its stderr's lines."""
    rc, _, lines = said_full(out, name)
    return rc, lines


def wait_file(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"the script ended (exit {proc.returncode}) before {path.name}"
        assert time.monotonic() < deadline, f"no {path.name} after {timeout} s"
        time.sleep(0.02)


def test_a_stage_that_cannot_fit_is_refused_before_its_first_byte_and_runs_once_the_disk_grows(
    big_hub, big_manifest, tmp_path
):
    """~13 MB to stage into an 8 MiB disk: one line with both figures, exit 4, no file body asked for,
    nothing in tmp/. Remounted at 64 MiB, the same stage stages and verifies."""
    script = """
run stage1 stage "$M"
ls -A "$HOMEDIR/tmp" >"$OUT/tmp1" 2>/dev/null
touch "$OUT/refused"; wait_for "$OUT/go"
mount -o remount,size=64m "$DISK"
run stage2 stage "$M"
run verify2 verify
"""
    big_hub.reset_log()
    proc, home, out = in_tmpfs(tmp_path, big_hub, big_manifest, "8m", script)
    try:
        wait_file(out / "refused", proc)
        rc, lines = said(out, "stage1")
        assert rc == 4, lines
        assert len(lines) == 1, lines
        assert re.search(rf"needs 1\d\.\d MiB, [67]\.\d MiB free on {re.escape(str(home))} ", lines[0]), lines
        assert "nothing fetched" in lines[0]
        bodies = [r.path for r in big_hub.request_log if "_big_" in r.path or r.server == "cdn"]
        assert bodies == [], "refused before the first byte: no file body of the big variants asked for"
        assert (out / "tmp1").read_text() == "", "nothing left in the home's tmp/"
    finally:
        (out / "go").touch()
        proc.wait(timeout=300)
    assert proc.returncode == 0
    rc, lines = said(out, "stage2")
    assert rc == 0, lines
    assert said(out, "verify2")[0] == 0, (out / "verify2.out").read_text()


def test_a_disk_filled_mid_stage_stops_it_in_one_line_without_leaving_its_parts(big_hub, big_manifest, tmp_path):
    """The stage fits when it starts (20 MiB free for ~13 MB); once the big files' bodies are on their way
    (held after 200 kB each by the fake Hub), a second writer fills the disk. The stage stops: one line,
    exit 4, none of its .part files left, the home verify-clean. Grown to 64 MiB, the same stage stages."""
    script = """
run stage1 stage "$M" &
pid=$!
until find "$HOMEDIR/tmp" -name '*.part' -size +0c 2>/dev/null | grep -q .; do
    kill -0 $pid 2>/dev/null || break; sleep 0.02
done
dd if=/dev/zero of="$DISK/filler" bs=64k 2>/dev/null
touch "$OUT/filled"
wait $pid
find "$HOMEDIR/tmp" -name '*.part' >"$OUT/parts1" 2>/dev/null
df -B1 --output=avail "$DISK" | tail -n 1 >"$OUT/free1"
run verify1 verify
mount -o remount,size=64m "$DISK"
run stage2 stage "$M"
run verify2 verify
"""
    big_hub.faults.hold("_big_", 200_000)
    proc, home, out = in_tmpfs(tmp_path, big_hub, big_manifest, "20m", script)
    try:
        wait_file(out / "filled", proc)
    finally:
        big_hub.faults.release()
        proc.wait(timeout=300)
    assert proc.returncode == 0
    rc, lines = said(out, "stage1")
    assert rc == 4, lines
    assert len(lines) == 1 and "No space left on device" in lines[0] and "a local disk error" in lines[0], lines
    assert "upstream" not in lines[0], lines
    assert (out / "parts1").read_text() == "", "the stage's own .part files are removed"
    assert int((out / "free1").read_text()) > 0, "the disk is not left full"
    assert said(out, "verify1")[0] == 0, (out / "verify1.out").read_text()
    rc, lines = said(out, "stage2")
    assert rc == 0, lines
    assert said(out, "verify2")[0] == 0, (out / "verify2.out").read_text()
    assert BIG in (out / "stage2.out").read_text()


def test_the_margin_is_one_percent_within_its_bounds_unless_set(monkeypatch):
    from frt.mirror.stage.space import MIB, margin
    from frt.resolver.errors import BadInput

    monkeypatch.delenv("FRT_DISK_MARGIN_MIB", raising=False)
    assert [margin(n) for n in (100 * MIB, 20_000 * MIB, 10**7 * MIB)] == [64 * MIB, 200 * MIB, 1024 * MIB]
    monkeypatch.setenv("FRT_DISK_MARGIN_MIB", "0")
    assert margin(10**7 * MIB) == 0
    monkeypatch.setenv("FRT_DISK_MARGIN_MIB", "lots")
    with pytest.raises(BadInput, match="FRT_DISK_MARGIN_MIB='lots' is not a number"):
        margin(MIB)
