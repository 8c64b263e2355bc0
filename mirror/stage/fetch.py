"""Fetch one file of a resolved variant into the blob store: resumable, retried, verified.

The check is against what upstream advertised before the download: the LFS sha256
when it has one, else the git blob sha1 (`oid`). Clients of the Hub check only
sizes, so this is the one place where a tampered or truncated file is caught. A listed
file that the upstream then answers 404 for is refused the same way (`ListedFileMissing`):
its listing and its answer cannot both be right.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from frt.resolver.errors import DISK_FULL_ERRNOS, LocalDiskError, VerificationFailed
from frt.resolver.resolution import FileEntry

from ..store.blobs import Digest, RunningDigest, digest_file
from ..store.protocol import BlobStore
from .transport import ContentTooLarge, ListedFileMissing, Transport


class IntegrityError(VerificationFailed):
    """Upstream served bytes that do not match what it advertised for the file."""

    code = "IntegrityMismatch"  # the refusal's kind, as the ledger records it

    def __init__(self, message: str, *, repo: str, path: str, commit: str):
        super().__init__(message)
        self.repo, self.path, self.commit = repo, path, commit


class PublisherDigestMismatch(IntegrityError):
    """The bytes, or the upstream's word on them, are not what the publisher's digest (metadata.json) says."""

    code = "PublisherDigestMismatch"


class ListedFileRefused(IntegrityError):
    """The upstream answers 404 (or 410) for a file its own listing names: no bytes came at all."""

    code = "ListedFileMissing"


@dataclass(frozen=True)
class Fetched:
    entry: FileEntry
    digest: Digest
    downloaded: int  # bytes that crossed the wire for it in this run (0: already stored)


def fetch_workers(store: BlobStore, jobs: int) -> int:
    """Threads for `jobs` downloads at once (Transport's bodies) into `store`: twice as many where a commit
    is an upload of its own (an object store), so that the next downloads go on while the verified ones
    are uploaded, rather than each thread's upload waiting on its download and the next download on it."""
    return max(1, jobs) * (2 if store.objects is not None else 1)


def expected_key(entry: FileEntry) -> str:
    """The name of a blob-to-be: its advertised sha256 when known, else its git oid."""
    return entry.sha256 or entry.git_oid


def matches(entry: FileEntry, d: Digest) -> bool:
    if d.size != entry.size:
        return False
    return d.sha256 == entry.sha256 if entry.sha256 else d.git_oid == entry.git_oid


def fetch_file(
    transport: Transport,
    store: BlobStore,
    repo_id: str,
    commit: str,
    entry: FileEntry,
    *,
    known_sha256: str | None = None,
    publisher: set[str] | None = None,
    recorded: Mapping[str, Digest] | None = None,
    on_bytes: Callable[[int], None] = lambda n: None,
    repo_type: str = "kernel",
    stored_by_oid: Callable[[str], str | None] = lambda oid: None,
    on_stored: Callable[[Digest], None] = lambda d: None,
) -> Fetched:
    """Make sure `entry`'s verified bytes are in the store; download only what is missing.

    `publisher`: the sha256 values publishers' digests expect of these bytes (None: no digest
    lists the file). Bytes that match the upstream's word but none of those are never stored.
    `on_stored` records a blob as soon as it is stored, still under its lock, and `stored_by_oid`
    reads that record: so a stager that waited for another's download of a small file (known only by
    its git oid) finds it rather than fetching it again."""
    where = f"{repo_id}/{entry.path}@{commit[:12]}"
    sha = entry.sha256 or known_sha256
    if sha and publisher and sha not in publisher:
        raise PublisherDigestMismatch(
            f"{where}: the upstream advertises sha256 {sha}; the publisher's digest (metadata.json) "
            f"says {' or '.join(sorted(publisher))}",
            repo=repo_id,
            path=entry.path,
            commit=commit,
        )
    if sha and store.has(sha):
        return Fetched(entry, _stored_digest(store, entry, sha, recorded), 0)
    key = expected_key(entry)
    with store.scratch.lock(key):
        sha = sha or stored_by_oid(entry.git_oid)
        if sha and store.has(sha):  # another stager finished it while we waited for the lock
            return Fetched(entry, _stored_digest(store, entry, sha, recorded), 0)
        fetched = _download_verified(transport, store, repo_id, commit, entry, key, on_bytes, repo_type, publisher)
        on_stored(fetched.digest)
        return fetched


def _stored_digest(store: BlobStore, entry: FileEntry, sha: str, recorded: Mapping[str, Digest] | None) -> Digest:
    """The digest of a blob already in the store. An LFS file's listing names its *pointer's* git oid,
    so that is never the blob's: take the ledger's record, or re-hash a blob stored but not recorded
    (a run killed between the two, or another stager's)."""
    if recorded and sha in recorded:
        return recorded[sha]
    if not entry.sha256:  # known by its git oid: that oid is the content's
        return Digest(sha, entry.git_oid, entry.size)
    return store.digest(sha)


def _download_verified(
    transport: Transport,
    store: BlobStore,
    repo_id: str,
    commit: str,
    entry: FileEntry,
    key: str,
    on_bytes: Callable[[int], None],
    repo_type: str,
    publisher: set[str] | None,
) -> Fetched:
    part = store.scratch.part_path(key)
    downloaded = 0
    where = f"{repo_id}/{entry.path}@{commit[:12]}"

    def count(n: int) -> None:
        nonlocal downloaded
        downloaded += n
        on_bytes(n)

    running = RunningDigest(entry.size)
    for clean_retry in (False, True):
        had = part.exists() and part.stat().st_size > 0
        try:
            transport.fetch(
                repo_id,
                entry.path,
                commit,
                part,
                size=entry.size,
                on_bytes=count,
                repo_type=repo_type,
                running=running,
                git_oid=None if clean_retry else entry.git_oid,
            )
        except ContentTooLarge as e:
            part.unlink(missing_ok=True)
            raise IntegrityError(str(e), repo=repo_id, path=entry.path, commit=commit) from None
        except ListedFileMissing as e:  # the upstream's listing and its answer disagree: refused, as a bad hash is
            raise ListedFileRefused(str(e), repo=repo_id, path=entry.path, commit=commit) from None
        except LocalDiskError:
            # The disk filled (or this stage stopped because it did): a part kept for a rerun would keep
            # it full, and the commands that free space need some. Removed under the blob's lock, so
            # never a part another stager has taken over. A rerun fetches the file again from byte 0.
            with suppress(OSError):
                part.unlink(missing_ok=True)
            raise
        digest = running.digest(part) or digest_file(part)
        if matches(entry, digest) and publisher and digest.sha256 not in publisher:
            part.unlink()
            raise PublisherDigestMismatch(
                f"{where}: served bytes match the upstream's git oid {entry.git_oid} but hash to "
                f"sha256 {digest.sha256}; the publisher's digest (metadata.json) says "
                f"{' or '.join(sorted(publisher))}",
                repo=repo_id,
                path=entry.path,
                commit=commit,
            )
        if matches(entry, digest):
            _commit(store, part, digest, where)
            return Fetched(entry, digest, downloaded)
        part.unlink()
        if had and not clean_retry:  # a stale prefix from an earlier run: one clean try
            continue
        want = f"sha256 {entry.sha256}" if entry.sha256 else f"git oid {entry.git_oid}"
        got = f"sha256 {digest.sha256}" if entry.sha256 else f"git oid {digest.git_oid}"
        raise IntegrityError(
            f"{where}: upstream advertised {want}, {entry.size} bytes; served {got}, {digest.size} bytes",
            repo=repo_id,
            path=entry.path,
            commit=commit,
        )
    raise AssertionError("unreachable")


def _commit(store: BlobStore, part: Path, digest: Digest, where: str) -> None:
    """Move a verified part into the store. A full disk can still refuse that last step (its fsync, the
    shard folder's mkdir, an object store's upload from a full tmp/): the part goes then, as it does when
    the download itself hits the full disk, and the stage stops with a disk error."""
    try:
        store.commit(part, digest)
    except OSError as e:
        if e.errno not in DISK_FULL_ERRNOS:
            raise
        with suppress(OSError):
            part.unlink(missing_ok=True)
        raise LocalDiskError.writing(f"{where} into the store", e) from None
