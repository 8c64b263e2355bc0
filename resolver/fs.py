"""Crash-safe writes, the one helper for them: a temp file beside the target, fsync, rename (or, for a
file that must not be overwritten, a hard link that fails if it exists), fsync of the directory. A reader
sees the old file or the new one, never half of one, and after a crash the rename is durable (DESIGN:
writes are atomic). Every layer writes through it, so it lives in the lowest one that writes."""

from __future__ import annotations

import functools
import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, cast


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_file(path: Path, *, mode: int | None = None, exclusive: bool = False) -> Iterator[BinaryIO]:
    """The open temp file to write `path` through; in place once the block ends without an error.
    `mode`: the file's, exactly, from its creation on (a private key is never readable by others, even
    for an instant); None: the umask's. `exclusive`: FileExistsError, and nothing written, if `path`
    exists when it would land."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666 if mode is None else mode)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)  # the umask may have narrowed it
        if exclusive:
            os.link(tmp, path)
        else:
            os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write(path: Path, data: bytes | str, *, mode: int | None = None, exclusive: bool = False) -> Path:
    with atomic_file(path, mode=mode, exclusive=exclusive) as f:
        f.write(data.encode() if isinstance(data, str) else data)
    return Path(path)


@functools.cache
def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """libc's sync_file_range(2), where there is one (Linux): the os module has none. Looked up on first
    use (ctypes is not worth loading for every command)."""
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    fn.restype = ctypes.c_int
    return cast("Callable[[int, int, int, int], int]", fn)


_WRITE = 2  # SYNC_FILE_RANGE_WRITE: start writing the dirty pages of the range out, without waiting for them


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Start writing `nbytes` at `offset` of `fd` to disk now, and return: a writer of a big file that will
    be fsynced keeps the disk busy while it produces the rest, so its fsync at the end waits for little
    (where the dirty pages would otherwise sit until the fsync, or the kernel's 30 s). Only a hint: the
    fsync is what makes the bytes durable, and nothing happens where the call does not exist."""
    if (sync_file_range := _sync_file_range()) is not None:
        sync_file_range(fd, offset, nbytes, _WRITE)
