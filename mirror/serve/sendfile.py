"""A whole-file GET of a blob this process verified lately, sent by sendfile(2) from serve's HTTP protocol
(limits.guarded, hot_get): no ASGI task, and no byte of the file through Python.

Why: a GET streamed through the app reads each chunk into Python (pread) and writes it out again (the
transport), two copies of every byte on the one core serve has; sendfile has the kernel move the page
cache's pages to the socket. At 64 clients that was most of serve's time (py-spy: the transport's write
30%, the reads 19%).

The promise of blob.py holds: only a file this process verified lately (Integrity.fresh_key, its key
taken from the open descriptor) is sent this way; its last TAIL bytes are held back until the file is
checked to be still that very file, verified (else the answer is cut: the connection closed short of
Content-Length). uvloop keeps its own descriptor of the socket, which it will not share with a writer
it does not know: the bytes go through a dup(2) of it, waited on for writability as a descriptor of
its own, and only once uvloop has nothing queued for that socket (the protocol checks).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .catalog import ServedFile
from .integrity import Integrity, file_key

if TYPE_CHECKING:
    from starlette.types import Scope

    from .app import MirrorApp

TAIL = 64 << 10  # held back until the file is checked to be the one verified


@dataclass
class FileSend:
    """What the protocol sends: `lines` (the answer's header lines, Content-Length included), then the
    `size` bytes of the open `fd`; `check()` before the tail; `done(status, sent)` once, through
    `finish`: as the tail is handed on (before it goes, as Counted counts the app's answers), or, where
    no tail went, once the send is over."""

    fd: int
    size: int
    lines: bytes
    check: Callable[[], bool]
    done: Callable[[int, int], None]
    finished: bool = False

    def finish(self, status: int, sent: int) -> None:
        if not self.finished:
            self.finished = True
            self.done(status, sent)

    @classmethod
    def open(
        cls, f: ServedFile, lines: bytes, integrity: Integrity, done: Callable[[int, int], None]
    ) -> FileSend | None:
        """The file's send, if it is the one this process verified lately; None: the app answers (it
        verifies as it sends, or refuses)."""
        try:
            fd = os.open(f.stored_blob, os.O_RDONLY)
        except OSError:
            return None
        st = os.fstat(fd)
        key = integrity.fresh_key(f, st)
        # serve --cache-max: held against eviction while open (cache_cap.py); refused: the app answers
        if key is None or st.st_size != f.size or (integrity.cache is not None and not integrity.cache.lease(fd)):
            os.close(fd)
            return None

        def check() -> bool:
            return file_key(os.fstat(fd)) == key and integrity.same(f, st)

        return cls(fd, f.size, lines, check, done)


def hot_get(app: MirrorApp, scope: Scope, t0: float) -> FileSend | None:
    """The protocol's fast_get (limits.guarded, run.py): a whole-file GET that app.hot() would answer
    from a file this process verified lately; logged and counted as hot() does once it is over. None
    (through the app): what fast_head declines, a hand-off to nginx, a file not verified lately (the app
    hashes it as it sends it), an object store's blob."""
    if not isinstance(app.integrity, Integrity) or (found := app.protocol_hit(scope)) is None:
        return None
    if found[1] and app.accel_redirect:
        return None
    return FileSend.open(
        found[0].file, found[0].lines, app.integrity, lambda status, sent: app.record_hot(scope, status, sent, t0)
    )


async def send(loop: asyncio.AbstractEventLoop, sock_fd: int, head: bytes, fs: FileSend) -> int | None:
    """Write `head`, then the file, to the socket: the body bytes sent, or None where the file was not
    the one verified any more (cut short: the caller closes the connection). Closes the file. OSError:
    the client went away."""
    wfd = os.dup(sock_fd)
    try:
        await _write(loop, wfd, head)
        off = await _sendfile(loop, wfd, fs.fd, 0, fs.size - min(TAIL, fs.size))
        if not fs.check():
            return None
        fs.finish(200, fs.size)
        return await _sendfile(loop, wfd, fs.fd, off, fs.size)
    finally:
        os.close(wfd)
        os.close(fs.fd)


async def _write(loop: asyncio.AbstractEventLoop, wfd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(wfd, view) :]
        except BlockingIOError:
            await _writable(loop, wfd)


async def _sendfile(loop: asyncio.AbstractEventLoop, wfd: int, fd: int, off: int, end: int) -> int:
    while off < end:
        try:
            n = os.sendfile(wfd, fd, off, end - off)
        except BlockingIOError:
            await _writable(loop, wfd)
            continue
        if n == 0:
            raise OSError(f"the file ends at {off} bytes, before {end}")
        off += n
    return off


async def _writable(loop: asyncio.AbstractEventLoop, wfd: int) -> None:
    ready = loop.create_future()
    # set_result's None is only the callback's value, which add_writer ignores
    loop.add_writer(wfd, lambda: ready.done() or ready.set_result(None))  # type: ignore[func-returns-value]
    try:
        await ready
    finally:
        loop.remove_writer(wfd)
