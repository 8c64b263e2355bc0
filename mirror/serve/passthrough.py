"""A file the home's disk cannot take, passed from the upstream to the client without being kept.

Pull-through normally fetches a missed file into the store and answers from there (pull.py, stream.py).
When the disk cannot take it (disk.py: full, or the file is larger than the free space), it is relayed
instead: the upstream's bytes, hashed as they pass, go to the client and nowhere else. Nothing is written,
so nothing is left half-written: no `.part`, no ledger row.

Verified as integrity on read verifies (integrity.py): the last chunk is held back until the bytes hash to
what the listing says (an LFS file's sha256, a small file's git oid). Bytes that do not, or an upstream
that fails past its retries, end the answer short (fewer bytes than Content-Length: the client keeps an
`.incomplete` file, never a whole wrong one, and tries again); where nothing was sent yet, the status
line has not gone either, and the client gets the same 502 as for a failed fetch. Each attempt after a
dropped connection resumes with `Range` at the bytes already relayed (the hash runs on).

The relay starts from any byte: a big file streamed from its growing `.part` (stream.py) whose fetch
then hits a full disk goes on from the upstream at the byte the client has reached, its hash fed the
bytes already sent first. Each answer relays its own transfer: 64 clients of a file the disk cannot
take cost the upstream 64 transfers (there is nowhere to keep one for the others).

The upstream is read in a thread of its own per answer (not the event loop's pool, which the store's work
needs), through the Hub client's transport rules (wire.stream: its redirects, pacer and deadline; the
one retry loop), a few chunks ahead of the client at most.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from huggingface_hub.utils._headers import build_hf_headers  # as stage/transport.py imports it
from starlette.responses import Response

from frt.resolver import wire
from frt.resolver.errors import FrtError, UpstreamUnavailable, VerificationFailed, first_line

from .cut import cut
from .metrics import observe_pull
from .unavailable import upstream_error

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from starlette.types import Receive, Scope, Send

    from frt.resolver.hub import HubClient

    from .catalog import ServedFile
    from .pull import PullService

    Body = Callable[[bytes, bool], Awaitable[None]]  # as stream.py's: (chunk, more_body)

DEPTH = 16  # chunks read ahead of the client (a socket read each, 64 KiB at most): the memory one relay holds
_END = object()


class Gone(Exception):
    """The client went away: the relay stops, the upstream's transfer with it."""


class _Stopped(Exception):
    pass


@dataclass(frozen=True)
class Passage:
    """One listed file at one commit, as the relay fetches and checks it."""

    repo_type: str
    repo_id: str
    commit: str
    f: ServedFile

    @property
    def where(self) -> str:
        return f"{self.repo_id}/{self.f.path}@{self.commit[:12]}"

    def hasher(self) -> Any:
        """What the bytes must hash to is `expected`: an LFS file's sha256, a small file's git blob oid."""
        if self.f.lfs:
            return hashlib.sha256()
        h = hashlib.sha1(usedforsecurity=False)
        h.update(b"blob %d\0" % self.f.size)
        return h

    @property
    def expected(self) -> str:
        return self.f.sha256 if self.f.lfs else self.f.oid


class _Reader(threading.Thread):
    """The upstream's bytes of the file from `offset`, in order, into a queue the answer reads; a chunk
    list's end is _END, a failure one of our errors."""

    def __init__(self, hub: HubClient, p: Passage, offset: int) -> None:
        super().__init__(daemon=True, name=f"pass-through {p.f.path}")
        self.hub, self.p, self.got = hub, p, offset
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[object] = asyncio.Queue()
        self.room = threading.Semaphore(DEPTH)
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            self.hub.attempts(self._one, where=self.p.where, prefix=f"{self.p.where}: ")
            self._put(_END)
        except _Stopped:
            pass
        except FrtError as e:
            self._put(e, wait=False)
        except Exception as e:  # noqa: BLE001  one of ours for the answer, never a thread's traceback
            self._put(UpstreamUnavailable(f"{self.p.where}: {first_line(e)}"), wait=False)

    def _one(self) -> None:
        """One request from the bytes relayed so far (a server that ignores Range: its first ones skipped)."""
        p, size = self.p, self.p.f.size
        headers = build_hf_headers(token=self.hub.token)
        if self.got:
            headers["Range"] = f"bytes={self.got}-"
        deadline = self.hub.limits.deadline(size - self.got)
        url = self.hub.file_url(p.repo_id, p.f.path, p.commit, p.repo_type)
        with wire.stream(url, headers=headers, deadline=deadline, pacer=self.hub.pacer) as r:
            wire.raise_for_status(r, deadline)
            skip = self.got if r.status_code != 206 else 0
            for chunk in r.iter_bytes():
                if skip:
                    chunk, skip = chunk[skip:], max(0, skip - len(chunk))
                if self.got + len(chunk) > size:
                    raise VerificationFailed(f"{p.where}: the upstream sent more than the listed {size} bytes")
                if chunk:
                    self._put(chunk)
                    self.got += len(chunk)
                deadline.check(p.where)
        if self.got < size:  # a transient failure: the retry loop asks again from here
            raise ConnectionError(f"the upstream's answer ended after {self.got} of {size} bytes")

    def _put(self, item: object, wait: bool = True) -> None:
        while wait and not self.room.acquire(timeout=0.5):
            if self.stop.is_set():
                raise _Stopped
        if self.stop.is_set():
            raise _Stopped
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the loop is closed (serve is stopping)
            raise _Stopped from None

    async def get(self, gone: asyncio.Future[None]) -> object:
        """The next item; Gone once the client has gone."""
        nxt: asyncio.Future[Any] = asyncio.ensure_future(self.queue.get())
        await asyncio.wait({nxt, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not nxt.done():
            nxt.cancel()
            raise Gone
        item = nxt.result()
        if isinstance(item, bytes):
            self.room.release()
        return item


async def relay(
    service: PullService, p: Passage, offset: int, hasher: Any, body: Body, gone: asyncio.Future[None]
) -> None:
    """Send the file's bytes `offset`.. through `body`, `hasher` fed the bytes before `offset` already; the
    last chunk only once the whole file hashes to what is listed. Raises one of our errors (nothing of a
    failed file's end was sent), or Gone."""
    t0, outcome, reader = time.perf_counter(), "error", _Reader(service.pull.hub, p, offset)
    reader.start()
    got, held = offset, b""
    try:
        while (item := await reader.get(gone)) is not _END:
            if isinstance(item, FrtError):
                outcome = "unavailable" if isinstance(item, UpstreamUnavailable) else "refused"
                raise item
            assert isinstance(item, bytes)  # the reader puts bytes, _END or one of our errors
            hasher.update(item)
            got += len(item)
            if held:
                await body(held, True)
            held = item
        if got != p.f.size or hasher.hexdigest() != p.expected:
            outcome = "refused"
            raise VerificationFailed(
                f"{p.where}: passed through unkept, the upstream's {got} bytes do not hash to the listed "
                f"{'sha256' if p.f.lfs else 'git oid'} {p.expected}"
            )
        outcome = "passed"
        await body(held, False)
    finally:
        reader.stop.set()
        observe_pull("file", time.perf_counter() - t0, got - offset, outcome)


class PassThroughResponse(Response):
    """200 with the file's headers (Content-Length its size, whatever Range asked: both clients start over
    on a 200), its bytes relayed from the upstream. The status line waits for the first chunk: an upstream
    that fails before one gets the client the 502 a failed fetch gets."""

    def __init__(
        self,
        service: PullService,
        p: Passage,
        headers: list[tuple[bytes, bytes]],
        gone: asyncio.Future[None] | None = None,
    ) -> None:
        self.status_code, self.raw_headers, self.background = 200, headers, None
        self.service, self.p, self.gone = service, p, gone  # gone: the caller already watches the client

    # The body bytes sent, for the access log, as FlowResponse's (Starlette's Response.__call__ returns None).
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> int:  # type: ignore[override]
        sent, own = 0, self.gone is None
        gone = self.gone or asyncio.ensure_future(disconnected(receive))

        async def body(chunk: bytes, more: bool) -> None:
            nonlocal sent
            if sent == 0:
                await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            await send({"type": "http.response.body", "body": chunk, "more_body": more})
            sent += len(chunk) or 1  # a file of 0 bytes has still started

        try:
            await relay(self.service, self.p, 0, self.p.hasher(), body, gone)
        except Gone:
            pass
        except FrtError as e:
            if sent == 0:
                answer = upstream_error(e, self.p.where, self.service.come_back()).response(head=False)
                self.status_code = answer.status_code
                await answer(scope, receive, send)
                return 0
            cut(self.p.f.path, sent, self.p.f.size, e)  # returning incomplete: the server closes the connection
        finally:
            if own:
                gone.cancel()
        return min(sent, self.p.f.size)


async def disconnected(receive: Receive) -> None:
    """Returns once the client has gone (a GET's request message comes first)."""
    while (await receive())["type"] != "http.disconnect":
        pass
