"""A file's answer from an object store (serve on `--store s3://…`): the same promise as blob.py's, that
an answer is never completed with bytes this process has not verified, kept with what S3 gives.

- A whole GET streams the object and hashes it as it goes; the last chunk is held back until the digest
  matches the blob's name. A mismatch cuts the answer short (a 500 before any byte went), and the object
  is quarantined as a bad file is (integrity.py): moved aside to PREFIX/quarantine/<sha256>.<ns> (only if
  it is still the object found bad, by its ETag), counted and recorded, so that `stage`, or pull-through
  on the next request, fetches it again. Until then a request for it is a 500; every RECHECK_S one looks
  whether it is back (streamed, hashed, and vouched for again if it is).
- A Range, and a whole GET of an object this process verified whole within FRT_SERVE_VERIFY_TTL (as blob.py
  sends a file it verified lately unhashed), go unhashed, and only as the object verified: the GET is made
  conditional on the ETag it was verified under (If-Match). An object replaced since answers 412, never
  other bytes, and is judged afresh (a Range: verified whole again; a whole GET: hashed as it is sent),
  once: the same bytes put back under a new ETag (gc'd and staged again) are served, not refused.
- HEAD needs no object at all: the catalog has every header.
- Behind nginx (`serve --accel-redirect PREFIX`, nginx-conf on the same store), a GET nginx forwarded is
  answered with its headers and `X-Accel-Redirect: PREFIX/<presigned URL's path and query>`: nginx fetches
  the object itself, so a replica killed mid-download takes no body with it. Only once this process
  verified the object whole, as for a Range.
- With `serve --s3-redirect`, a GET is a 302 to a presigned URL of the object, as the Hub's resolve of an
  LFS file is a 302 to its CDN, with the same headers a HEAD gets; only once this process verified the
  object whole (as for a Range), since the bytes then go from the store to the client unseen.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from frt.resolver.settings import env_number

from .catalog import RawHeaders, ServedFile
from .cut import cut
from .integrity import MAX_ENTRIES, TTL_ENV, quarantine_counter, record_quarantine
from .protocol import HubError

if TYPE_CHECKING:
    from prometheus_client import Counter
    from starlette.types import Receive, Scope, Send

    from ..store.home import Home
    from ..store.s3 import S3BlobStore
    from .metrics import Metrics

log = logging.getLogger("frt.serve")
CHUNK = 1 << 20
RECHECK_S = 2.0  # how often a request looks whether a quarantined object was put back


class ObjectIntegrity:
    """What one serve process verified of an object store's blobs (sha256 -> the ETag then, and when) and
    what it found bad (sha256 -> that ETag). The same questions the app asks of integrity.Integrity."""

    def __init__(
        self,
        store: S3BlobStore,
        metrics: Metrics | None = None,
        ttl: float | None = None,
        home: Home | None = None,
    ) -> None:
        self.store, self.ttl = store, env_number(TTL_ENV, 3600.0) if ttl is None else ttl
        self.home = home  # where quarantines are recorded (None in bare test apps)
        self.counter: Counter | None = quarantine_counter(metrics) if metrics is not None else None
        self._verified: dict[str, tuple[str, float]] = {}
        # sha256 -> the ETag of the object found bad; None: moved aside (and _looked: when last looked for)
        self.bad: dict[str, str | None] = {}
        self._looked: dict[str, float] = {}
        self._checks: dict[str, asyncio.Future[None]] = {}
        self.redirect = False  # serve --s3-redirect
        self.redirect_ttl = env_number("FRT_S3_REDIRECT_TTL", 600.0)
        self._signed: dict[str, tuple[str, float]] = {}  # sha256 -> (presigned URL, reused until)

    def presigned(self, f: ServedFile) -> str:
        """A presigned GET URL of the object, valid at least half of FRT_S3_REDIRECT_TTL from now: one
        signature per blob per half TTL, not one per request."""
        import obstore

        now, hit = time.monotonic(), self._signed.get(f.sha256)
        if hit is not None and now < hit[1]:
            return hit[0]
        url = obstore.sign(self.store.client, "GET", self.store.key(f.sha256), timedelta(seconds=self.redirect_ttl))
        if len(self._signed) >= MAX_ENTRIES:
            self._signed.clear()
        self._signed[f.sha256] = (url, now + self.redirect_ttl / 2)
        return url

    def handoff(self, f: ServedFile, prefix: str) -> tuple[tuple[bytes, bytes], ...] | None:
        """The X-Accel-Redirect header that hands a GET of `f` to nginx (nginx-conf on an S3 store), which
        fetches the object itself by its presigned URL: `PREFIX/<URL's path>?<its query>`; None where this
        process has not verified the object whole lately (the bytes go from the store to the client unseen).
        The headers to add to the answer."""
        if (etag := self.fresh(f)) is None or f.sha256 in self.bad:
            return None
        url = urlsplit(self.presigned(f))
        # nginx asks the store If-Match the ETag verified here: an object replaced since is a 412, which
        # nginx answers by a replica's stream (hashed, so never sent whole) rather than by other bytes.
        return (
            (b"x-accel-redirect", f"{prefix}{url.path}?{url.query}".encode()),
            (b"x-frt-object-etag", etag.encode()),
        )

    def response(
        self, f: ServedFile, start: int, end: int, status: int, headers: RawHeaders, head: bool = False
    ) -> ObjectResponse:
        return ObjectResponse(self, f, start, end, status, headers, head)

    def refused(self, f: ServedFile) -> bool:
        """Is `f`'s object one found bad? Once it was moved aside, every RECHECK_S one request is let
        through to look for it again (stage or pull-through may have put it back)."""
        if f.sha256 not in self.bad:
            return False
        if self.bad[f.sha256] is not None:
            return True
        now = time.monotonic()
        if now - self._looked.get(f.sha256, 0.0) < RECHECK_S:
            return True
        self._looked[f.sha256] = now
        return False

    def error(self, f: ServedFile) -> HubError:
        return HubError(
            500,
            None,
            f"{f.path}: the mirror's stored object failed verification (blob {f.sha256}) and is quarantined: "
            "'frt-mirror stage' fetches it again",
        )

    def fresh(self, f: ServedFile) -> str | None:
        """The ETag the object was verified under within the TTL; None: not lately."""
        hit = self._verified.get(f.sha256)
        return hit[0] if hit is not None and time.monotonic() - hit[1] < self.ttl else None

    def vouch(self, f: ServedFile, etag: str) -> None:
        if len(self._verified) >= MAX_ENTRIES:
            self._verified.clear()
        self._verified[f.sha256] = (etag, time.monotonic())
        self.bad.pop(f.sha256, None)  # put back, whole: no longer refused
        self._looked.pop(f.sha256, None)

    def stale(self, f: ServedFile, etag: str) -> None:
        """The object is no longer the one verified under `etag` (the store answered 412 to If-Match it)."""
        hit = self._verified.get(f.sha256)
        if hit is not None and hit[0] == etag:  # not a verification another request made since
            del self._verified[f.sha256]

    def condemn(self, f: ServedFile, etag: str | None, got: str | None) -> None:
        """The object (`etag`) hashed to `got`, not to its name: refuse it, and quarantine it in a thread
        (a few requests to the store; the ledger written there too)."""
        first = self.bad.get(f.sha256, ()) != etag
        self.bad[f.sha256], _ = etag, self._verified.pop(f.sha256, None)
        if first:
            threading.Thread(target=self._quarantine, args=(f, etag, got), name="frt-quarantine", daemon=True).start()

    def _quarantine(self, f: ServedFile, etag: str | None, got: str | None) -> None:
        where = self._set_aside(f, etag)
        if where is not None:  # the bad object is no longer under its key: looked for again from now on
            self.store.forget(f.sha256)
            if self.bad.get(f.sha256, ()) == etag:
                self.bad[f.sha256] = None
        detail = f"{f.path}: object hashes to {got or f'fewer than {f.size} bytes'}; {where or 'left in place'}"
        log.warning("frt-mirror: serve: blob %s failed verification on read, quarantined: %s", f.sha256, detail)
        if self.counter is not None:
            self.counter.inc()
        if self.home is not None:
            record_quarantine(self.home, f, detail)

    def _set_aside(self, f: ServedFile, etag: str | None) -> str | None:
        """Move the object to PREFIX/quarantine/ if it is still the one found bad. What became of it (it is
        no longer under its key), or None: still there (no ETag to tell it by, or the store refusing)."""
        import obstore

        client, key = self.store.client, self.store.key(f.sha256)
        dest = f"quarantine/{f.sha256}.{time.time_ns()}"
        try:
            if etag is None:
                return None
            if obstore.head(client, key)["e_tag"] != etag:
                return "replaced since (judged afresh when next read)"
            obstore.copy(client, key, dest)
            obstore.delete(client, key)
        except FileNotFoundError:
            return "gone already"
        except Exception as e:  # noqa: BLE001  (the store refusing: refused here all the same)
            log.warning("frt-mirror: serve: could not move %s aside: %s", key, str(e).split("\n")[0])
            return None
        return f"moved to {self.store.url}/{dest}"

    async def ensure(self, f: ServedFile) -> str:
        """The object verified whole (cached, or hashed now once for every request waiting): its ETag."""
        if f.sha256 in self.bad:
            raise self.error(f)
        if (etag := self.fresh(f)) is not None:
            return etag
        fut = self._checks.get(f.sha256)
        if fut is None:
            fut = self._checks[f.sha256] = asyncio.ensure_future(self._check(f))
            fut.add_done_callback(lambda _: self._checks.pop(f.sha256, None))
        await asyncio.shield(fut)
        if (etag := self.fresh(f)) is None:
            raise self.error(f)
        return etag

    async def _check(self, f: ServedFile) -> None:
        got, h = await open_object(self.store, f, 0, f.size, None), hashlib.sha256()
        n = 0
        async for chunk in got.stream(min_chunk_size=CHUNK):
            h.update(chunk)
            n += len(chunk)
        etag = got.meta["e_tag"]
        if n == f.size and h.hexdigest() == f.sha256:
            self.vouch(f, etag)
        else:
            self.condemn(f, etag, h.hexdigest() if n == f.size else None)


class Changed(Exception):
    """The object is not the one asked for If-Match its ETag (a 412): replaced since it was verified."""


async def open_object(store: S3BlobStore, f: ServedFile, start: int, end: int, etag: str | None) -> Any:
    """obstore's answer for bytes [start, end) of `f`'s object (If-Match `etag` where given: Changed if the
    object is another now)."""
    import obstore
    from obstore.exceptions import PreconditionError

    options: Any = {}
    if start or end != f.size:
        options["range"] = (start, end)
    if etag is not None:
        options["if_match"] = etag
    try:
        return await obstore.get_async(store.client, store.key(f.sha256), options=options or None)
    except FileNotFoundError:
        raise HubError(500, None, f"{f.path}: blob {f.sha256} is no longer in the store ({store.url})") from None
    except PreconditionError:
        raise Changed(etag) from None
    except Exception as e:  # noqa: BLE001  (obstore's errors: a refusing or unreachable store)
        said = str(e).split("\n")[0]
        raise HubError(503, None, f"{f.path}: the object store ({store.url}) did not answer: {said}") from None


class ObjectResponse:
    """Sends an object's bytes [start, end) under `headers` (raw pairs, Content-Length included; kept as
    `raw_headers`, as Starlette's responses keep theirs, so the app can add one: X-Mirror-Stale)."""

    def __init__(
        self,
        integrity: ObjectIntegrity,
        f: ServedFile,
        start: int,
        end: int,
        status: int,
        headers: RawHeaders,
        head: bool,
    ) -> None:
        self.integrity, self.file, self.start, self.end = integrity, f, start, end
        self.status_code, self.raw_headers, self.head = status, list(headers), head

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> int:
        f, integrity = self.file, self.integrity
        if self.head:
            await self._start(send)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return 0
        whole = self.start == 0 and self.end == f.size
        if integrity.redirect:
            return await self._redirect(scope, receive, send)
        try:
            etag, got = await self._open(whole)
        except HubError as e:
            self.status_code = e.status
            await e.response()(scope, receive, send)
            return 0
        h = hashlib.sha256() if etag is None else None  # not verified lately: hashed as it goes
        sent, held, started = 0, b"", False
        async for chunk in got.stream(min_chunk_size=CHUNK):
            if h is not None:
                h.update(chunk)
            if held:
                if not started:
                    started = True
                    await self._start(send)
                await send({"type": "http.response.body", "body": held, "more_body": True})
                sent += len(held)
            held = bytes(chunk)
        total = sent + len(held)
        ok = total == self.end - self.start
        if h is not None:
            digest = h.hexdigest()
            if ok and digest == f.sha256:
                integrity.vouch(f, got.meta["e_tag"])
            else:
                ok = False
                integrity.condemn(f, got.meta["e_tag"], digest if total == f.size else None)
        if not ok:
            if not started:
                self.status_code = 500
                await integrity.error(f).response()(scope, receive, send)
                return 0
            return self._cut(sent)
        if not started:
            await self._start(send)
        await send({"type": "http.response.body", "body": held, "more_body": False})
        return total

    async def _open(self, whole: bool) -> tuple[str | None, Any]:
        """The object's answer, and the ETag it was verified under (If-Match'd), or None: a whole GET of an
        object not verified lately, to hash as it is sent. A Range is only of bytes verified whole (ensure);
        an object replaced since its verification (a 412) is judged afresh, once."""
        f, integrity = self.file, self.integrity
        for _ in range(2):
            etag = integrity.fresh(f) if whole else await integrity.ensure(f)
            try:
                return etag, await open_object(integrity.store, f, self.start, self.end, etag)
            except Changed:
                assert etag is not None  # only a conditional GET answers 412
                integrity.stale(f, etag)
        raise HubError(503, None, f"{f.path}: blob {f.sha256} was replaced in the store while it was being read")

    async def _redirect(self, scope: Scope, receive: Receive, send: Send) -> int:
        try:
            await self.integrity.ensure(self.file)
            location = self.integrity.presigned(self.file)
        except HubError as e:
            self.status_code = e.status
            await e.response()(scope, receive, send)
            return 0
        self.status_code = 302
        kept = [(k, v) for k, v in self.raw_headers if k not in (b"content-length", b"content-range")]
        self.raw_headers = [*kept, (b"location", location.encode()), (b"content-length", b"0")]
        await self._start(send)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return 0

    async def _start(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": list(self.raw_headers)})

    def _cut(self, sent: int) -> int:
        return cut(self.file.path, sent, self.end - self.start, "the object failed verification")
