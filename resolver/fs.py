"""Crash-safe writes, the one helper for them: a temp file beside the target, fsync, rename (or, for a
file that must not be overwritten, a hard link that fails if it exists), fsync of the directory. A reader
sees the old file or the new one, never half of one, and after a crash the rename is durable (DESIGN:
writes are atomic). Every layer writes through it, so it lives in the lowest one that writes."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


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
