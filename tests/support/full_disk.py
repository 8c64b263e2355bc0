"""A home on a disk filled to its last byte: a small tmpfs mounted inside `unshare -m` (CI runs as root, and
the mount is the namespace's alone), a shell script that stages into it, fills what is left with a filler
file and runs commands there, each one's stdout, stderr and exit code landing outside the tmpfs."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import EXE, cli_env

# The sh functions a script uses: `run NAME ARGS...` runs frt-mirror on the home, its stdout, stderr and exit
# code into $OUT/NAME.{out,err,rc}; `fill` writes a filler file until the disk has no byte left (a new name
# each time: gc or unstage may have freed some meanwhile); `free NAME` keeps the free bytes in $OUT/NAME;
# `listing NAME` every path of the home with its type, size and mtime, into $OUT/NAME.
PRELUDE = """
set -u
run() {
    n=$1; shift
    "$EXE" --home "$HOMEDIR" --endpoint "$URL" "$@" >"$OUT/$n.out" 2>"$OUT/$n.err"; echo $? >"$OUT/$n.rc"
}
fill() { dd if=/dev/zero of="$DISK/filler.$(date +%s%N)" bs=4k 2>/dev/null; true; }
free() { df -B1 --output=avail "$DISK" | tail -n 1 | tr -d ' ' >"$OUT/$1"; }
listing() { find "$HOMEDIR" -printf '%y %p %s %T@\\n' | sort >"$OUT/$1"; }
wait_for() { while [ ! -e "$1" ]; do sleep 0.02; done; }
mount -t tmpfs -o size="$SIZE" tmpfs "$DISK" || exit 97
mkdir "$HOMEDIR" "$DISK/cache"
export XDG_CACHE_HOME="$DISK/cache"  # the memos of host targets and kernels' answers: full as well
"""


def start_full(tmp_path: Path, hub, size: str, script: str, **env: str) -> tuple[subprocess.Popen, Path, Path]:
    """`script` (after PRELUDE) started in a mount namespace of its own with a `size` tmpfs at tmp_path/disk
    and the home on it; returns the process, the home and the out folder (outside the tmpfs). `env`: more
    variables for the script."""
    if os.geteuid() != 0:
        pytest.fail("needs root for a tmpfs in a mount namespace (CI runs as root)")
    disk, out = tmp_path / "disk", tmp_path / "out"
    disk.mkdir()
    out.mkdir()
    variables = cli_env(
        FRT_DISK_MARGIN_MIB="1",  # a small disk: the default (64 MiB at least) would refuse every stage
        EXE=EXE,
        DISK=str(disk),
        HOMEDIR=str(disk / "home"),
        OUT=str(out),
        URL=hub.url,
        SIZE=size,
        **env,
    )
    proc = subprocess.Popen(["unshare", "-m", "sh", "-c", PRELUDE + script], env=variables)
    return proc, disk / "home", out


def run_full(tmp_path: Path, hub, size: str, script: str, **env: str) -> Path:
    """start_full, waited for: the out folder."""
    proc, _, out = start_full(tmp_path, hub, size, script, **env)
    assert proc.wait(timeout=600) == 0, f"the script itself failed (exit {proc.returncode})"
    return out


def said(out: Path, name: str) -> tuple[int, str, list[str]]:
    """A step's exit code, stdout, and stderr's lines."""
    err = (out / f"{name}.err").read_text()
    assert "Traceback" not in err, err
    return int((out / f"{name}.rc").read_text()), (out / f"{name}.out").read_text(), err.strip().splitlines()


def ok_json(out: Path, name: str) -> Any:
    """A step that exited 0 with --json: its document."""
    rc, stdout, err = said(out, name)
    assert rc == 0, (name, err)
    return json.loads(stdout)


def number(out: Path, name: str) -> int:
    return int((out / name).read_text())
