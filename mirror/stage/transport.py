"""File bodies from the upstream into a `.part` file: the one place that speaks the Hub's transport.

What the real Hub does on `GET /{repo}/resolve/{commit}/{path}`, and what this answers with:
- a small file: **307** with a relative `Location` to `/api/resolve-cache/…` on the same host —
  followed;
- an LFS file: **302** to a signed URL on a CDN host, expiring after about an hour — followed, and
  `Authorization` is not carried across (httpx drops it on a cross-origin redirect). A **403 from
  the CDN** means the signature expired (a stalled or resumed transfer): ask the Hub again for a
  fresh one and resume at the bytes already in the `.part`;
- **429**: the bucket's window is spent — asked again once it resets (`frt.resolver.pacing`, which
  admits every hop, the 307 and the CDN's too), not counted as a failed attempt;
- a dropped connection, a timeout, 5xx: retried with backoff, resuming with `Range`;
- a redirect loop or a redirect off http(s) (`file:///etc/passwd`): refused at once, not retried;
- **404** for a file the upstream's own listing names: the upstream contradicts itself about an
  immutable commit. `ListedFileMissing`, a refusal (exit 1, recorded): not "try again later" (exit 3),
  since asking again gets the same answer, and not bad input (exit 2): the user asked for nothing wrong.
Every body is bounded: a file's by its listed size, an error answer's by 64 KiB, and the whole request by
a deadline (`wire.Limits.deadline(size)`, checked as each piece arrives), so a trickle ends too.
A local write that fails (disk full, permission, read-only mount) is `LocalDiskError`, never
reported as the upstream refusing. The bytes are judged by the caller (`fetch`), not here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import BinaryIO, Literal
from urllib.parse import urlsplit

# As resolver/hub.py: huggingface_hub.utils' lazy facade does not export it to mypy.
from huggingface_hub.utils._headers import build_hf_headers

from frt.resolver import wire
from frt.resolver.attempts import redirect_refusal
from frt.resolver.errors import FrtError, LocalDiskError, UpstreamUnavailable, first_line
from frt.resolver.hub import HubClient

from ..store.blobs import RunningDigest

try:  # huggingface_hub 2.x speaks httpx2, 1.x httpx
    import httpx2 as _httpx
except ImportError:  # pragma: no cover - exercised in the 1.x environment
    # 1.x's httpx is not installed beside mypy, which checks the module as httpx2 (the same API here)
    import httpx as _httpx  # type: ignore[no-redef, import-not-found]

MAX_RESIGNS = 5


class ContentTooLarge(FrtError):
    """Upstream sent more bytes than it advertised for a file."""


class ListedFileMissing(FrtError):
    """The upstream answers 404 (or 410) for a file its own listing of that commit names."""


class _SignatureExpired(Exception):
    pass


class Transport:
    def __init__(self, hub: HubClient, bodies: int | None = None):
        """`bodies`: at most this many file bodies in flight at once, however many threads fetch (stage's
        --jobs, where a store's commit is an upload: a thread uploading what it fetched holds no download)."""
        self.hub = hub
        self._bodies: AbstractContextManager[object] = (
            threading.BoundedSemaphore(bodies) if bodies is not None else nullcontext()
        )

    def fetch(
        self,
        repo_id: str,
        path: str,
        commit: str,
        part: Path,
        *,
        size: int,
        on_bytes: Callable[[int], None] = lambda n: None,
        repo_type: str = "kernel",
        running: RunningDigest | None = None,
        git_oid: str | None = None,
    ) -> None:
        """Make `part` hold the file's `size` bytes as served (resuming what it has), or raise.
        `running` is fed every byte the part ends up with, in order (see store.RunningDigest).
        Each attempt resumes from what the part holds; the loop is the Hub client's (HubClient.attempts).
        `git_oid`: where this run's scan already read the file (HubClient.small), its bytes are taken
        from there; they are verified after, as any download is."""
        where = f"{repo_id}/{path}@{commit[:12]}"
        held = self.hub.small.get(git_oid) if git_oid else None
        if held is not None and len(held) == size and _size(part) == 0:
            with local_file(part, "wb") as f:
                _write(f, held, part)
            if running is not None:
                running.update(held)
            on_bytes(len(held))
            return

        def one() -> None:
            for _signing in range(MAX_RESIGNS + 1):  # an expired signature: the Hub signs a new URL next time
                have = _size(part)
                if have > size:
                    part.unlink()
                    have = 0
                if have == size and part.exists():
                    return
                try:
                    return self._get(
                        repo_id,
                        path,
                        commit,
                        part,
                        offset=have,
                        limit=size,
                        on_bytes=on_bytes,
                        repo_type=repo_type,
                        running=running,
                    )
                except _SignatureExpired:
                    continue
            raise UpstreamUnavailable(f"{where}: the CDN refused {MAX_RESIGNS + 1} freshly signed URLs")

        def transport_errors(e: Exception) -> Exception | None:
            status = getattr(getattr(e, "response", None), "status_code", None)
            if redirect_refusal(e) is None and status in (404, 410):
                return ListedFileMissing(
                    f"{where}: the upstream lists this file ({size} bytes) but answers {status} for it: {first_line(e)}"
                )
            return None

        with self._bodies:
            self.hub.attempts(one, where=where, classify=transport_errors, prefix=f"{where}: ")

    def _get(
        self,
        repo_id: str,
        path: str,
        commit: str,
        dest: Path,
        *,
        offset: int,
        limit: int,
        on_bytes: Callable[[int], None],
        repo_type: str,
        running: RunningDigest | None,
    ) -> None:
        """One request, following the Hub's redirects, streaming into `dest` from `offset`."""
        headers = build_hf_headers(token=self.hub.token)
        if offset:
            headers["Range"] = f"bytes={offset}-"
        url = self.hub.file_url(repo_id, path, commit, repo_type)
        where = f"{repo_id}/{path}@{commit[:12]}"
        deadline = self.hub.limits.deadline(limit - offset)
        with wire.stream(url, headers=headers, deadline=deadline, pacer=self.hub.pacer) as r:
            if r.status_code == 403 and _left_host(r, self.hub.endpoint):
                raise _SignatureExpired()  # its body unread: the connection is closed with the answer
            if r.status_code == 416:
                dest.unlink(missing_ok=True)
                raise _httpx.RemoteProtocolError("416 Range Not Satisfiable: restarting from byte 0")
            wire.raise_for_status(r, deadline)
            written = offset if r.status_code == 206 and offset else 0
            if offset and not written:
                on_bytes(-offset)  # the server ignored Range: the file restarts from byte 0
                # ...as a new file, not truncated in place: a .part only ever grows, so what a streaming
                # answer read of it is a prefix of whatever the same inode holds when it is verified.
                dest.unlink(missing_ok=True)
            if running is not None:
                running.catch_up(dest, written)
            with local_file(dest, "ab" if written else "wb") as f:
                for chunk in r.iter_bytes():  # each piece as it arrives (at most a socket read, 64 KiB)
                    written += len(chunk)
                    if written > limit:
                        raise ContentTooLarge(f"{where}: more than the advertised {limit} bytes")
                    _write(f, chunk, dest)
                    if running is not None:
                        running.update(chunk)
                    on_bytes(len(chunk))
                    deadline.check(where)  # what was written stays: the next attempt resumes from it


def _left_host(r: _httpx.Response, endpoint: str) -> bool:
    """The answer came from another host than the Hub's (a redirect to the CDN)."""
    return urlsplit(str(r.url)).netloc != urlsplit(endpoint).netloc


@contextmanager
def local_file(dest: Path, mode: Literal["wb", "ab"]) -> Iterator[BinaryIO]:
    """`dest` open for the download; failing to open it, or to flush it on close (a full disk shows
    there as often as on a write), is a local disk error, never the upstream's."""
    try:
        f = open(dest, mode)
    except OSError as e:
        raise LocalDiskError.writing(dest, e) from None
    try:
        yield f
    finally:
        try:
            f.close()
        except OSError as e:
            raise LocalDiskError.writing(dest, e) from None


def _write(f: BinaryIO, chunk: bytes, dest: Path) -> None:
    try:
        f.write(chunk)
    except OSError as e:
        raise LocalDiskError.writing(dest, e) from None


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except FileNotFoundError:
        return 0
