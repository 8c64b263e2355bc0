"""A serve whose home is on a small tmpfs, mounted inside `unshare -m` as tests/test_stage_disk.py mounts one
for stage (so CI's root mounts nothing outside the test): what a full disk looks like to pull-through.
The test sees the tmpfs through /proc/<serve's pid>/root, that process's own view of the mounts."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.serve_helpers import Served, serving

# sh -c SCRIPT SIZE DISK EXE ARGS...: mount, make the home's folder, become serve (same pid: the test's handle).
MOUNT = 'mount -t tmpfs -o size="$0" tmpfs "$1" || exit 97; mkdir -p "$1/home" || exit 97; shift; exec "$@"'


@contextlib.contextmanager
def serving_on_tmpfs(tmp_path: Path, size: str, *args: str, env: dict) -> Iterator[tuple[Served, Path]]:
    """serve with its home on a `size` tmpfs; yields it and the tmpfs as this process reaches it."""
    if os.geteuid() != 0:
        pytest.fail("needs root for a tmpfs in a mount namespace (CI runs as root)")
    disk = tmp_path / "disk"
    disk.mkdir()
    prefix = ("unshare", "-m", "sh", "-c", MOUNT, size, str(disk))
    with serving(disk / "home", *args, env=env, prefix=prefix) as served:
        yield served, Path(f"/proc/{served.proc.pid}/root{disk}")


def fill(disk: Path, name: str = "filler") -> int:
    """A second writer takes every free byte of the disk; the bytes it wrote."""
    wrote = 0
    with open(disk / name, "ab", buffering=0) as f:
        chunk = b"\0" * (64 << 10)
        while True:
            try:
                n = f.write(chunk)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                if len(chunk) == 1:
                    return wrote
                chunk = chunk[: len(chunk) // 2]
                continue
            wrote += n or 0


def parts(disk: Path) -> list[str]:
    """The `.part` files left in the home's tmp/."""
    tmp = disk / "home" / "tmp"
    return sorted(p.name for p in tmp.rglob("*.part")) if tmp.exists() else []
