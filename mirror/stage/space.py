"""Room on the disk for a stage, checked before its first byte.

Stage knows every chosen file's size from the listings before it fetches anything, so a stage that cannot
fit is refused at once, in one line with both figures, instead of filling the disk on its way to the same
failure (and leaving it full of `.part` files that `verify` and `gc` then cannot run beside).

What is counted: each file whose blob the store does not hold, less what its `.part` already has (a rerun
resumes it). What is compared: the free space of the home's filesystem (tmp/, where parts grow, and
store/, where they are renamed to, are one filesystem: a rename cannot cross two) less a margin that is
kept spare for what a stage writes without knowing its size first: the ledger's rows, the views'
directories, the wheels of python-depends, and anyone else writing to that disk meanwhile.

On an object store (--store s3://…) nothing is checked: the bucket has no free-space figure to ask, and
this host's tmp/ holds at most --jobs parts at once, each uploaded and removed as soon as it is verified.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from frt.resolver.errors import NotEnoughSpace
from frt.resolver.resolution import FileEntry
from frt.resolver.settings import env_number

from ..store.protocol import BlobStore
from .fetch import expected_key
from .progress import human_bytes

MIB = 1 << 20
# The default margin: 1% of the filesystem, at least 64 MiB (a ledger and views for thousands of variants)
# and at most 1 GiB (past that, 1% of a large disk would refuse stages that fit with room to spare).
MARGIN_MIN, MARGIN_MAX, MARGIN_SHARE = 64 * MIB, 1024 * MIB, 0.01
MARGIN_ENV = "FRT_DISK_MARGIN_MIB"


def margin(total: int) -> int:
    """Bytes kept free on a filesystem of `total` bytes: $FRT_DISK_MARGIN_MIB (MiB, 0 allowed), else the
    default above."""
    default = min(MARGIN_MAX, max(MARGIN_MIN, int(total * MARGIN_SHARE)))
    return int(env_number(MARGIN_ENV, default / MIB) * MIB)


def missing_bytes(store: BlobStore, entries: Iterable[FileEntry], known: Mapping[str, str]) -> int:
    """What fetching `entries` adds to the disk: the sizes of those whose blob the store does not hold
    (`known`: the sha256 the ledger has for a git oid), less the bytes their `.part` files already hold."""
    total = 0
    for f in entries:
        sha = f.sha256 or known.get(f.git_oid)
        if sha and store.has(sha):
            continue
        part = store.scratch.tmp / f"{expected_key(f)}.part"  # as Scratch.part_path names it (without making tmp/)
        try:
            have = part.stat().st_size
        except OSError:
            have = 0
        total += max(0, f.size - have)
    return total


def check_space(store: BlobStore, needs: int) -> None:
    """Refuse (NotEnoughSpace) when `needs` more bytes do not fit the home's free space less the margin."""
    if store.files is None or needs == 0:  # an object store: see the module's docstring
        return
    where, free, keep = free_space(store)
    if needs > free - keep:
        raise NotEnoughSpace(
            f"not enough disk space: needs {human_bytes(needs)}, {human_bytes(free)} free on {where} "
            f"(keeping {human_bytes(keep)} spare: {MARGIN_ENV}); nothing fetched"
        )


def free_space(store: BlobStore) -> tuple[Path, int, int]:
    """The one reading of the home's free space (stage's check, pull-through's full disk, serve --min-free):
    the folder read, the bytes free to this user (f_bavail), and the margin kept spare on that filesystem."""
    where = _existing(store.scratch.tmp.parent)  # the home: its parts and its blobs are on one filesystem
    st = os.statvfs(where)
    return where, st.f_bavail * st.f_frsize, margin(st.f_blocks * st.f_frsize)


def _existing(path: Path) -> Path:
    """`path`, or the nearest folder above it that exists (a home's folders are made on first use)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path
