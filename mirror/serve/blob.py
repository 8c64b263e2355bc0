"""A file's answer from the store: its fixed headers, and its bytes (a range of them) in large chunks."""

from __future__ import annotations

import functools
import os

import anyio
from starlette.responses import Response

from .catalog import ServedFile

CHUNK = 4 << 20
INLINE = 256 << 10  # bodies up to this size are read on the event loop (see BlobResponse)


@functools.lru_cache(maxsize=1 << 16)
def file_headers(commit: str, etag: str, lfs_sha256: str | None, size: int) -> tuple:
    """A file answer's fixed headers, encoded once: HEAD is the hot path (one per file per snapshot),
    and building them through Starlette's Response cost about as much as the rest of the request."""
    headers = [(b"x-repo-commit", commit.encode()), (b"etag", f'"{etag}"'.encode()),
               (b"accept-ranges", b"bytes"), (b"content-type", b"application/octet-stream")]
    if lfs_sha256:
        headers += [(b"x-linked-etag", f'"{lfs_sha256}"'.encode()), (b"x-linked-size", b"%d" % size)]
    return tuple(headers)


class BlobResponse(Response):
    """Answers HEAD, or streams a byte range of a store blob in large chunks (read off the event loop
    unless small). `headers` are raw (name, value) bytes pairs, Content-Length included."""

    def __init__(self, f: ServedFile, start: int, end: int, status: int, headers: list, head: bool = False):
        self.status_code, self.raw_headers, self.background = status, headers, None
        self.file, self.start, self.end, self.head = f, start, end, head

    async def __call__(self, scope, receive, send) -> int:
        """Sends the answer; returns the body bytes sent."""
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        if self.head:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return 0
        fd = os.open(self.file.blob, os.O_RDONLY)
        try:
            off = self.start
            while off < self.end:
                n = min(CHUNK, self.end - off)
                if self.end - self.start <= INLINE:  # a thread hop costs more than a small cached read
                    chunk = os.pread(fd, n, off)
                else:
                    chunk = await anyio.to_thread.run_sync(os.pread, fd, n, off)
                if not chunk:
                    break
                off += len(chunk)
                await send({"type": "http.response.body", "body": chunk, "more_body": off < self.end})
            if off == self.start:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            os.close(fd)
        return off - self.start
