"""A file's answer from the store: its fixed headers, and its bytes (a range of them) in large chunks,
never completed with bytes that were not verified (integrity.py)."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import os
from typing import TYPE_CHECKING

import anyio
from starlette.responses import Response

from .catalog import RawHeaders, ServedFile
from .cut import cut
from .integrity import Integrity, file_key
from .pin import mark, marked, release
from .protocol import HubError

if TYPE_CHECKING:
    from _hashlib import HASH

    from starlette.types import Receive, Scope, Send

CHUNK = 4 << 20
INLINE = 256 << 10  # bodies up to this size are read on the event loop (see BlobResponse)


@functools.lru_cache(maxsize=1 << 16)
def file_headers(commit: str, etag: str, lfs_sha256: str | None, size: int) -> tuple[tuple[bytes, bytes], ...]:
    """A file answer's fixed headers, encoded once: HEAD is the hot path (one per file per snapshot),
    and building them through Starlette's Response cost about as much as the rest of the request."""
    headers = [
        (b"x-repo-commit", commit.encode()),
        (b"etag", f'"{etag}"'.encode()),
        (b"accept-ranges", b"bytes"),
        (b"content-type", b"application/octet-stream"),
    ]
    if lfs_sha256:
        headers += [(b"x-linked-etag", f'"{lfs_sha256}"'.encode()), (b"x-linked-size", b"%d" % size)]
    return tuple(headers)


class BlobResponse(Response):
    """Answers HEAD, or sends a byte range of a store blob in large chunks (read off the event loop
    unless small; while hashing, the next chunk is read as this one is sent). `headers` are raw (name,
    value) bytes pairs, Content-Length included. The last chunk is held back: unless the file is one
    this process verified lately (Integrity.fresh; a Range always is, Integrity.ensure saw to it) it is
    hashed as it is sent, and the last chunk goes once the digest matches; else it goes if the file is
    still the one verified. A bad file is cut short (or, before any byte went, a 500)."""

    def __init__(
        self,
        f: ServedFile,
        start: int,
        end: int,
        status: int,
        headers: RawHeaders,
        head: bool = False,
        integrity: Integrity | None = None,
    ) -> None:
        self.status_code, self.background = status, None
        # Starlette types raw_headers as a list; a tuple (the hot path's, built once per URL) is sent as it is.
        self.raw_headers = headers  # type: ignore[assignment]
        self.file, self.start, self.end, self.head, self.integrity = f, start, end, head, integrity

    # The body bytes sent, for the access log (MirrorApp.hot); Starlette ignores what __call__ returns.
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> int:  # type: ignore[override]
        """Sends the answer; returns the body bytes sent (self.status_code: the status sent)."""
        try:
            return await self._answer(scope, receive, send)
        finally:
            release(scope)  # the pin its fetch took (pin.py): this answer held the blob itself, or never will

    async def _answer(self, scope: Scope, receive: Receive, send: Send) -> int:
        if self.head:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return 0
        cache = self._integrity().cache
        try:
            fd = os.open(self.file.stored_blob, os.O_RDONLY)
        except (FileNotFoundError, LookupError) as e:  # moved out by another process (quarantined) since
            if cache is not None:  # or evicted (serve --cache-max) since this request looked (or its fetch
                return await self._refuse(again(scope), scope, receive, send)  # stored it): pulled again
            if isinstance(e, LookupError):  # a caller's bug (catalog.stored_blob)
                raise
            return await self._refuse(self._integrity().gone(self.file), scope, receive, send)
        if cache is not None and not cache.lease(fd):  # held against eviction while open, or being evicted
            os.close(fd)
            return await self._refuse(again(scope), scope, receive, send)
        try:
            n, st = self.end - self.start, os.fstat(fd)
            if n <= INLINE and (key := self._integrity().fresh_key(self.file, st)) is not None:
                # The common small GET of a file verified lately: one read on the event loop, no hash; the
                # file must still be that one after the read (what _held_back checks, inline: ~10 us less).
                chunk = os.pread(fd, n, self.start)
                if len(chunk) == n and file_key(os.fstat(fd)) == key:
                    await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
                    await send({"type": "http.response.body", "body": chunk, "more_body": False})
                    return n
                self._integrity().forget(self.file)  # changed: judged again below (hashed as it is sent)
            return await self._send(fd, scope, receive, send)
        finally:
            os.close(fd)

    async def _send(self, fd: int, scope: Scope, receive: Receive, send: Send) -> int:
        f, integrity, st = self.file, self._integrity(), os.fstat(fd)
        # Verified lately (a Range always is): sent as it is, checked at the end. Else this answer hashes
        # it for everyone asking meanwhile, or, where another already does, waits for its word at the end.
        trusted = not (self.start == 0 and self.end == f.size) or integrity.fresh(f, st)
        verifier = None if trusted else integrity.begin(f)
        try:
            h = hashlib.sha256() if verifier is not None else None
            return await self._chunks(fd, st, h, trusted, scope, receive, send)
        finally:
            if verifier is not None:
                integrity.end(f, verifier)

    async def _chunks(
        self, fd: int, st: os.stat_result, h: HASH | None, trusted: bool, scope: Scope, receive: Receive, send: Send
    ) -> int:
        off, end = self.start, self.end

        def read(at: int) -> bytes:  # in order: the next read starts after this one returned
            chunk = os.pread(fd, min(CHUNK, end - at), at)
            if h is not None:
                h.update(chunk)  # releases the GIL: the event loop sends meanwhile
            return chunk

        small, loop, nxt, started = end - off <= INLINE, asyncio.get_running_loop(), None, False
        # Hashing, the next chunk is read (and hashed) while this one is sent; otherwise one chunk at a
        # time, as before integrity on read (no second chunk in memory per answer).
        ahead = h is not None and not small
        try:
            while True:
                if small:  # a thread hop costs more than a small cached read
                    chunk = read(off)
                elif ahead:
                    chunk = await (nxt or loop.run_in_executor(None, read, off))
                else:
                    chunk = await anyio.to_thread.run_sync(read, off)
                off += len(chunk)
                last = off >= end or not chunk
                nxt = loop.run_in_executor(None, read, off) if ahead and not last else None
                if last and (problem := await self._held_back(fd, st, h, off, trusted)):
                    if not started:
                        return await self._refuse(self._integrity().error(self.file), scope, receive, send)
                    return self._cut(off - len(chunk) - self.start, problem)
                if not started:
                    started = True
                    await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
                await send({"type": "http.response.body", "body": chunk, "more_body": not last})
                if last:
                    return off - self.start
        finally:
            if nxt is not None:  # a read in flight must finish before its fd is closed
                await asyncio.wait({nxt})

    async def _held_back(self, fd: int, st: os.stat_result, h: HASH | None, off: int, trusted: bool) -> str | None:
        """Why the last chunk must not go (None: it may). `h`: the whole file's hash as read; None where
        the file was verified before (`trusted`) or is being verified by another (its word is awaited):
        then it must still be that very file."""
        f, integrity = self.file, self._integrity()
        if h is not None:
            got = h.hexdigest() if off >= self.end else None
            if got != f.sha256:
                integrity.quarantine(f, st, got)
                return f"it hashes to {got or f'fewer than {f.size} bytes'}, not to its name: quarantined"
            if file_key(os.fstat(fd)) == file_key(st):
                integrity.vouch(f, st)
            return None
        if not trusted:
            try:
                await integrity.ensure(f)
            except HubError as e:
                return e.message
        if off < self.end or file_key(os.fstat(fd)) != file_key(st) or not integrity.same(f, st):
            integrity.forget(f)  # the next request verifies it again
            return "the file changed since it was verified"
        return None

    def _cut(self, sent: int, problem: str) -> int:
        """End the answer short: returning with the body incomplete makes the server close the connection
        (cut.py: this says why)."""
        return cut(self.file.path, sent, self.end - self.start, problem)

    async def _refuse(self, error: HubError, scope: Scope, receive: Receive, send: Send) -> int:
        self.status_code = error.status
        await error.response()(scope, receive, send)
        return 0

    def _integrity(self) -> Integrity:
        if self.integrity is None:
            self.integrity = FileIntegrity()
        return self.integrity


def again(scope: Scope) -> HubError:
    """A 307 to the very URL, marked (pin.py): its blob was evicted between this request's look and its
    open. The client follows it (huggingface_hub follows same-host redirects) and the marked request is
    answered through a fetch, which pins the blob. Never twice: a marked request that finds its blob gone
    all the same gets a 503 with Retry-After (a client retries it; no redirect loop)."""
    if marked(scope):
        return HubError(503, None, "evicted from this mirror's cache again: try again shortly", {"Retry-After": "1"})
    return HubError(307, None, "evicted from this mirror's cache just now: fetched again", {"Location": mark(scope)})


class FileIntegrity(Integrity):
    """Integrity on read over a filesystem store: its answers are BlobResponses (objects.ObjectIntegrity
    is an object store's)."""

    def response(
        self, f: ServedFile, start: int, end: int, status: int, headers: RawHeaders, head: bool = False
    ) -> BlobResponse:
        """The answer that sends `f`'s bytes [start, end) under `headers`."""
        return BlobResponse(f, start, end, status, headers, head=head, integrity=self)
