"""A big file's first answers, sent while pull-through fetches it: the bytes as they reach the `.part`
file, the last one only once the whole file is verified and stored.

Why: a client waiting for the mirror's whole upstream transfer receives nothing meanwhile, and
huggingface_hub gives up after 10 s without a byte (HF_HUB_DOWNLOAD_TIMEOUT), retrying from scratch.

What keeps it honest (clients check only sizes, so the mirror is the only check):
- The client never has the whole file until the mirror verified it: the last byte is held back, and
  a fetch that fails or is refused cuts the answer short. The client then has an `.incomplete` file.
- A resume of such a file must not append a verified tail to bytes the mirror never vouched for: the
  fetch (or this answer) records the blob as unvouched in the home's events
  (PullThrough.note_unvouched), and serve answers any Range request for it with the whole file, a
  200, which both huggingface_hub 1.x and 2.x take as "start over" (they truncate what they had).
- Bytes sent are the bytes of the very file that is verified: the answer reads one open `.part`
  (same inode, renamed into the store on success; a fetch that starts over writes a new one) and is
  cut if the fetch started over.

Any serve process over the home streams so: one that finds another (a worker, a replica, a stage)
fetching the file waits on its per-blob lock in a thread, while its answer reads the same `.part`.

On an object store (--store s3://…) the verified `.part` is uploaded and unlinked, not renamed: the
answer's rest is read from the part it has open, once that file hashes whole to the blob's name (so
what was sent is a prefix of verified bytes); an answer that had sent nothing and has no such part
streams the object as any answer does (objects.py, hashed on the way).
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING

import anyio
from starlette.responses import Response

from frt.resolver.errors import FrtError, LocalDiskError

from .blob import CHUNK
from .cache_cap import NoRoom
from .catalog import ServedFile
from .cut import cut
from .flow import Flow
from .integrity import hash_whole
from .objects import ObjectIntegrity
from .passthrough import Gone, Passage, PassThroughResponse, disconnected, relay
from .pull import PullService
from .unavailable import upstream_error

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from pathlib import Path

    from starlette.types import Receive, Scope, Send

    from .pin import Pin

    # What an answer's bytes go through: (chunk, more_body); the status line goes before the first one.
    Body = Callable[[bytes, bool], Awaitable[None]]

POLL_S = 0.02  # how often an answer looks for new bytes in the `.part` (no per-write wakeup to a thread)


class Cut(Exception):
    """The bytes already sent cannot be vouched for: end the answer short."""


class FlowResponse(Response):
    """200 with the file's headers (Content-Length its size), then its bytes as the fetch writes them.
    A Range is not honoured: a file not yet stored is sent whole (both clients start over on a 200)."""

    def __init__(
        self,
        flow: Flow,
        service: PullService,
        headers: list[tuple[bytes, bytes]],
        objects: ObjectIntegrity | None = None,
        passage: Passage | None = None,
    ) -> None:
        self.status_code, self.raw_headers, self.background = 200, headers, None
        self.flow, self.service, self.started = flow, service, False
        self.passage = passage  # where the fetch meets a full disk, the rest is passed through (passthrough.py)
        self.objects = objects  # the blobs are objects: the stored file is read from the part (or the store)
        self.gone: asyncio.Future[None] | None = None  # the client's disconnect, watched while answering
        self.pin: Pin | None = None

    # The body bytes sent, for the access log; Starlette's Response.__call__ returns None, and ignores this.
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> int:  # type: ignore[override]
        """Sends the answer; returns the body bytes sent. The status line waits for the first byte: a
        fetch that fails before one is the same 502 as for a small file. Under a cache cap the stored
        blob is held by a share of the fetch's pin (pin.py) until this answer is done."""
        with self.service.waiting(self.flow.key):
            try:
                return await self._answer(scope, receive, send)
            finally:
                if self.pin is not None:
                    self.pin.close()

    async def _answer(self, scope: Scope, receive: Receive, send: Send) -> int:
        flow, fd = self.flow, None
        assert flow.done is not None  # PullService.begin set it before handing the flow out
        restarts, sent = flow.restarts, 0

        async def body(chunk: bytes, more: bool) -> None:
            nonlocal sent
            if sent == 0 and not self.started:
                self.started = True
                await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            await send({"type": "http.response.body", "body": chunk, "more_body": more})
            sent += len(chunk)

        self.gone = asyncio.ensure_future(disconnected(receive))
        try:
            fd = await self._while_fetching(body, restarts)
            if self.gone.done():  # the client went away: the fetch goes on, this answer stops
                return sent
            try:
                stored: ServedFile = await asyncio.shield(flow.done)
                self.pin = self.service.share(flow.key)  # no await since it landed
            except FrtError as e:
                if isinstance(e, (LocalDiskError, NoRoom)) and self.passage is not None and flow.restarts == restarts:
                    if not self.started:
                        return await PassThroughResponse(self.service, self.passage, self.raw_headers, self.gone)(
                            scope, receive, send
                        )
                    held, fd = fd, None  # _pass_on closes it
                    await self._pass_on(held, sent, body)
                    return sent
                if not self.started:
                    return await self._failed(e, scope, receive, send)
                raise Cut(str(e)) from None
            if self.objects is not None:
                return await self._rest_on_objects(stored, fd, restarts, sent, body, scope, receive, send)
            if sent:
                assert fd is not None  # what was sent was read from the part's fd
                if flow.restarts != restarts or os.fstat(fd).st_ino != os.stat(stored.stored_blob).st_ino:
                    raise Cut("the fetch started the file over after some of it was sent")
            await _rest_of(stored, sent, body)
            return sent
        except Cut as e:
            cut(flow.path, sent, flow.size, e)
            if sent:
                await self.service.note_unvouched(flow)
            return sent  # returning with the body incomplete makes the server close the connection
        finally:
            self.gone.cancel()
            if fd is not None:
                os.close(fd)

    async def _rest_on_objects(
        self,
        stored: ServedFile,
        fd: int | None,
        restarts: int,
        sent: int,
        body: Body,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> int:
        """The answer's end where the stored file is an object: from the part this answer read, once it
        hashes whole to the blob's name; else, with nothing sent yet, the object (hashed as it streams)."""
        same = self.flow.restarts == restarts and fd is not None
        # `same` holds only where fd is not None, which mypy cannot follow through the name
        if same and await anyio.to_thread.run_sync(hash_whole, fd, stored.size) == stored.sha256:  # type: ignore[arg-type]
            await _rest_of(stored, sent, body, fd)
            return sent
        if sent:
            raise Cut("the part read is not the file verified and stored")
        assert self.objects is not None  # the caller's test
        answer = self.objects.response(stored, 0, stored.size, 200, self.raw_headers)
        sent = await answer(scope, receive, send)
        self.status_code = answer.status_code
        return sent

    async def _pass_on(self, fd: int | None, sent: int, body: Body) -> None:
        """The fetch met a full disk after `sent` bytes went out (its part removed, the bytes still in the
        inode this answer holds open): hash those, close it (its space is freed), and relay the rest from
        the upstream, the whole file checked before the last chunk."""
        assert self.passage is not None and self.gone is not None  # the caller's test; set in __call__
        hasher = self.passage.hasher()
        try:
            had = await anyio.to_thread.run_sync(_feed, hasher, fd, sent) if fd is not None else -1
        finally:
            if fd is not None:
                os.close(fd)
        if had != sent:
            raise Cut("the bytes sent could not be read back to go on from the upstream")
        try:
            await relay(self.service, self.passage, sent, hasher, body, self.gone)
        except Gone:
            pass
        except FrtError as e:
            raise Cut(f"passing the rest through from the upstream: {e}") from None

    async def _failed(self, e: FrtError, scope: Scope, receive: Receive, send: Send) -> int:
        answer = upstream_error(e, self.flow.path, self.service.come_back()).response(head=False)
        await answer(scope, receive, send)
        return 0

    async def _while_fetching(self, body: Body, restarts: int) -> int | None:
        """Send what the `.part` holds, all but the last byte, until the fetch lands; the part's fd."""
        flow, sent, fd = self.flow, 0, None
        assert flow.done is not None and self.gone is not None  # set by PullService.begin and __call__
        limit = flow.size - 1
        while not flow.done.done() and not self.gone.done():
            if fd is None:
                fd = _open(flow.part)
            have = os.fstat(fd).st_size if fd is not None else 0
            if flow.restarts != restarts:
                raise Cut("the fetch started the file over")
            if have > sent and sent < limit:
                assert fd is not None  # it has bytes: it is open
                chunk = await anyio.to_thread.run_sync(os.pread, fd, min(CHUNK, have - sent, limit - sent), sent)
                if flow.restarts != restarts:
                    raise Cut("the fetch started the file over")
                await body(chunk, True)
                sent += len(chunk)
            else:
                if fd is not None and _replaced(flow.part, fd):
                    raise Cut("the fetch started the file over")
                await asyncio.sleep(POLL_S)
        return fd


def _feed(hasher: object, fd: int, size: int) -> int:
    """Feed `hasher` the open file's first `size` bytes; how many it had."""
    off = 0
    while off < size and (chunk := os.pread(fd, min(CHUNK, size - off), off)):
        hasher.update(chunk)  # type: ignore[attr-defined]
        off += len(chunk)
    return off


def _replaced(part: Path, fd: int) -> bool:
    """Is the `.part` now another file than the one being read? A fetch that starts over (in any
    process) writes a new one (transport.fetch); gone means stored, or given up: the flight says which."""
    try:
        return os.stat(part).st_ino != os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _open(part: Path) -> int | None:
    try:
        return os.open(part, os.O_RDONLY)
    except FileNotFoundError:  # not begun yet, or already stored
        return None


async def _rest_of(f: ServedFile, start: int, body: Body, part: int | None = None) -> None:
    """Bytes `start`.. of the stored (verified) file, or of `part` (an open file verified to be its bytes):
    the answer's end."""
    fd = os.open(f.stored_blob, os.O_RDONLY) if part is None else part
    try:
        off = start
        while off < f.size:
            chunk = await anyio.to_thread.run_sync(os.pread, fd, min(CHUNK, f.size - off), off)
            if not chunk:
                raise Cut("the stored file is shorter than listed")
            off += len(chunk)
            await body(chunk, off < f.size)
        if start >= f.size:
            await body(b"", False)
    finally:
        if part is None:
            os.close(fd)
