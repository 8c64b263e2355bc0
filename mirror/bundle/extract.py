"""Blob members of a bundle copied out of the archive and hashed in one pass, several at once.

A member's bytes are read with pread(2) straight from the archive's descriptor into a buffer its thread
keeps (tarfile's reader would copy each chunk twice more), hashed (sha256 and the git blob sha1) and
written with write(2) from that same buffer: what is hashed is exactly what is written, even if the
archive changes under the import. hashlib and write(2) let go of the GIL, so members copied on N threads
use N cores (read.py runs one per core, up to COPIERS): both hashes of every byte, the floor of a
verified import, are spread over the box rather than one core each.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from pathlib import Path

from frt.resolver.errors import LocalDiskError

from ..store.blobs import Digest
from .format import BundleRejected

CHUNK = 4 << 20  # fewer system calls and hash calls per MiB than 1 MiB
COPIERS = 8  # at most: past that, a bundle's few big members leave the rest idle
_BUFFER = threading.local()  # each copying thread's own CHUNK


def copiers() -> int:
    """Threads to copy members on: the cores this process may run on, up to COPIERS."""
    return max(1, min(COPIERS, len(os.sched_getaffinity(0))))


def copy_member(
    src: int,
    offset: int,
    size: int,
    out: int | None,
    on_bytes: Callable[[int], None] | None = None,
    written: Path | None = None,
) -> Digest:
    """The digest of the `size` bytes at `offset` of `src`, written to the descriptor `out` (None: only
    hashed). A failed write (a full disk) is the home's LocalDiskError, naming `written`; a failed read
    stays an OSError of the archive's."""
    buf = getattr(_BUFFER, "chunk", None)
    if buf is None:
        buf = _BUFFER.chunk = bytearray(CHUNK)
    h256, hgit = hashlib.sha256(), hashlib.sha1(f"blob {size}\0".encode())
    at, left = offset, size
    while left:
        view = memoryview(buf)[: min(CHUNK, left)]
        n = os.preadv(src, [view], at)
        if n == 0:
            raise BundleRejected(f"the archive ends inside a blob member ({left} bytes short)")
        view = view[:n]
        h256.update(view)
        hgit.update(view)
        if out is not None:
            try:
                _write_all(out, view)
            except OSError as e:
                raise LocalDiskError.writing(written or "a blob into the home", e) from None
        if on_bytes is not None:
            on_bytes(n)
        at, left = at + n, left - n
    return Digest(h256.hexdigest(), hgit.hexdigest(), size)


def _write_all(fd: int, view: memoryview) -> None:
    done = 0
    while done < len(view):
        done += os.write(fd, view[done:])
