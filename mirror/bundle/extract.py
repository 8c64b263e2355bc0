"""Blob members of a bundle copied out of the archive and hashed in one pass, several at once.

A member goes into its part a chunk at a time. copy_file_range(2) copies the chunk from the archive's
descriptor into the part inside the kernel (no trip through a Python buffer: on the 2-core VM of
bench/bundle.py, half the system time of read(2) and write(2) through one), then the chunk is read back
from the part, still in the page cache, with pread(2) into a buffer its thread keeps, and hashed (sha256
and the git blob sha1): what is hashed is exactly what the part holds, even if the archive changes under
the import. Writeback of each chunk starts as it lands (resolver.fs.start_writeback), so the disk writes
while later chunks are hashed and the part's fsync (on another thread: verify_member) waits for little.
Where copy_file_range can't copy (across filesystems on an older kernel, some network filesystems), the
chunk is read from the archive into that buffer, hashed and written from it: what is hashed is what is
written there too.

hashlib, copy_file_range, pread and write let go of the GIL, so members copied on N threads use N cores
(import runs one per core, up to COPIERS: verify_member): both hashes of every byte, the floor of a verified import, are
spread over the box rather than one core each.
"""

from __future__ import annotations

import errno
import hashlib
import os
import tarfile
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import NoReturn

from frt.resolver.errors import LocalDiskError
from frt.resolver.fs import start_writeback

from ..stage.progress import Progress
from ..store.blobs import Digest
from ..store.protocol import BlobStore
from .format import BundleRejected

CHUNK = 4 << 20  # fewer system calls and hash calls per MiB than 1 MiB
COPIERS = 8  # at most: past that, a bundle's few big members leave the rest idle
_BUFFER = threading.local()  # each copying thread's own CHUNK
# copy_file_range's answers for "not between these two files": read and write instead.
_NO_KERNEL_COPY = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF, errno.ETXTBSY}
_HOME_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}


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
    hashed), which is open for reading too, at its start. A failed write (a full disk) is the home's
    LocalDiskError, naming `written`; a failed read stays an OSError of the archive's."""
    buf = getattr(_BUFFER, "chunk", None)
    if buf is None:
        buf = _BUFFER.chunk = bytearray(CHUNK)
    h256, hgit = hashlib.sha256(), hashlib.sha1(f"blob {size}\0".encode())
    where = written or "a blob into the home"
    kernel_copy = out is not None
    done = 0
    while done < size:
        view = memoryview(buf)[: min(CHUNK, size - done)]
        if out is None:
            n = _read(src, offset + done, view, size - done)
        elif kernel_copy:
            try:
                n = _kernel_copy(src, offset + done, out, done, view, size - done)
            except OSError as e:
                if e.errno in _HOME_FULL:
                    raise LocalDiskError.writing(where, e) from None
                if e.errno not in _NO_KERNEL_COPY or done:
                    raise
                kernel_copy = False  # not between these two files: through the buffer, from the first byte
                continue
        else:
            n = _read(src, offset + done, view, size - done)
            try:
                _write_all(out, view[:n])
            except OSError as e:
                raise LocalDiskError.writing(where, e) from None
        if out is not None:
            start_writeback(out, done, n)
        h256.update(view[:n])
        hgit.update(view[:n])
        if on_bytes is not None:
            on_bytes(n)
        done += n
    return Digest(h256.hexdigest(), hgit.hexdigest(), size)


def _kernel_copy(src: int, at: int, out: int, to: int, view: memoryview, left: int) -> int:
    """Copy up to len(view) bytes at `at` of `src` to `to` of `out` in the kernel, then read what landed
    back into `view`; the count copied."""
    got = os.copy_file_range(src, out, len(view), at, to)
    if got == 0:
        _short(left)
    back = 0
    while back < got:
        k = os.preadv(out, [view[back:got]], to + back)
        if k == 0:  # another process truncated the part: nothing of it can be trusted
            raise BundleRejected(f"the part {to + back} bytes in was cut short as it was written")
        back += k
    return got


def _read(src: int, at: int, view: memoryview, left: int) -> int:
    n = os.preadv(src, [view], at)
    if n == 0:
        _short(left)
    return n


def _short(left: int) -> NoReturn:
    raise BundleRejected(f"the archive ends inside a blob member ({left} bytes short)")


def _write_all(fd: int, view: memoryview) -> None:
    done = 0
    while done < len(view):
        done += os.write(fd, view[done:])


def all_or_none(copying: list[Future[None]]) -> None:
    """Wait for every member's copy; at the first that fails, none not yet begun begins, those under
    way finish (each part they made is then in `parts`, for the caller to remove), and it is raised."""
    try:
        for f in copying:
            f.result()
    except BaseException:
        for f in copying:
            f.cancel()
        wait(copying)
        raise


def verify_member(
    src: int,
    m: tarfile.TarInfo,
    want: Digest,
    parts: dict[str, Path | None],
    store: BlobStore,
    meter: Progress | None,
    syncer: ThreadPoolExecutor,
    synced: list[Future[None]],
) -> None:
    """Copy one `blobs/<sha256>` member of the archive `src` (its header checked: _blob_members) into
    tmp/ (or nowhere, if the store has it), hashing it; its part is then fsynced and closed by `syncer`.
    Runs on several threads at once, each member on one."""
    sha = want.sha256
    part = parts[sha] = None if store.has(sha) else store.scratch.part_path(f"{sha}.import-{uuid.uuid4().hex}")
    add, done = meter.file(sha[:16], m.size) if meter is not None else (None, None)
    out: int | None = None
    if part is not None:
        try:
            out = os.open(part, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)  # read back (extract.py)
        except OSError as e:
            raise LocalDiskError.writing(part, e) from None
    try:
        got = copy_member(src, m.offset_data, m.size, out, add, written=part)
        if part is not None and out is not None:
            synced.append(syncer.submit(_sync_close, out, part))
            out = None
    finally:
        if out is not None:
            os.close(out)
        if done:
            done(False)  # counted below, once verified
    if got != want:
        raise BundleRejected(
            f"blob {sha} is tampered or damaged: expected sha256 {want.sha256}, "
            f"content hashes to {got.sha256} ({got.size} bytes)"
        )
    if meter:
        meter.file_done()


def _sync_close(fd: int, part: Path) -> None:
    try:
        os.fsync(fd)
    except OSError as e:
        raise LocalDiskError.writing(part, e) from None
    finally:
        os.close(fd)
