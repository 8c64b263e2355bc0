"""The blob store: files by sha256 under the home, written atomically, hard-linked into views.

A blob enters the store only after its bytes matched what upstream advertised
(sha256 for LFS files, the git blob sha1 for small ones). Until then it lives in
tmp/ as a `.part` file that no view can see; kill -9 at any moment leaves either
the old state or the new blob, never a half-written file under a final name.
"""

from __future__ import annotations

import errno
import hashlib
import os
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from filelock import FileLock

from frt.resolver.fs import fsync_dir

from ..home_path import HomeLayout

CHUNK = 1 << 20
# A lock across hosts by name (Ledger.named_lock on a server ledger); what it yields is not used.
SharedLock = Callable[[str], AbstractContextManager[object]]


@dataclass(frozen=True)
class Digest:
    sha256: str
    git_oid: str
    size: int


def digest_file(path: Path) -> Digest:
    """sha256 and git blob sha1 of a file in one read."""
    size = path.stat().st_size
    h256, hgit = hashlib.sha256(), hashlib.sha1(f"blob {size}\0".encode())
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h256.update(chunk)
            hgit.update(chunk)
    return Digest(h256.hexdigest(), hgit.hexdigest(), size)


class RunningDigest:
    """digest_file's two hashes of a `.part`, taken as it is written, so a finished download is not
    read back to be verified (for a big file that second read is what a streamed client would wait
    for before its last byte). `size` is the advertised size: the git oid's header. `catch_up` makes
    it cover exactly the part's first `upto` bytes before the download appends (a resume), re-reading
    only what it has not seen; `digest` is None unless it covers the whole file as advertised."""

    def __init__(self, size: int):
        self.size = size
        self.reset()

    def reset(self) -> None:
        self.h256, self.hgit, self.n = hashlib.sha256(), hashlib.sha1(f"blob {self.size}\0".encode()), 0

    def update(self, chunk: bytes) -> None:
        self.h256.update(chunk)
        self.hgit.update(chunk)
        self.n += len(chunk)

    def catch_up(self, path: Path, upto: int) -> None:
        if self.n > upto:  # the part was cut back or restarted: what was hashed is no longer its start
            self.reset()
        if self.n == upto:
            return
        with open(path, "rb") as f:
            f.seek(self.n)
            while self.n < upto and (chunk := f.read(min(CHUNK, upto - self.n))):
                self.update(chunk)
        if self.n != upto:
            self.reset()  # the part is shorter than it said: digest() stays None, the caller reads it whole

    def digest(self, path: Path) -> Digest | None:
        if self.n != self.size or _size(path) != self.n:
            return None
        return Digest(self.h256.hexdigest(), self.hgit.hexdigest(), self.n)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return -1


def store_root(home: Path) -> Path:
    """The folder a home's blobs lie under (nginx-conf aliases its internal location onto it)."""
    return HomeLayout(home).store


def blob_relpath(sha256: str) -> str:
    """Where a blob lies under the store's root (`store/sha256/`): what nginx's internal location
    over the store is asked for (serve --accel-redirect)."""
    return f"{sha256[:2]}/{sha256}"


class BlobStore:
    """`shared_lock(key)`: a lock every host sharing this store honours (the ledger's server gives one:
    many shared filesystems do not honour file locks across hosts); the file lock is taken as well."""

    def __init__(self, home: Path, shared_lock: SharedLock | None = None):
        self.shared_lock = shared_lock
        self.root = store_root(home)
        self.tmp = HomeLayout(home).tmp
        self.locks = HomeLayout(home).locks
        for d in (self.root, self.tmp, self.locks):
            try:
                d.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                # A read-only home (a cluster's mount) is only read: a missing folder just holds
                # nothing. A writer still fails, at its first write, saying where.
                if e.errno not in (errno.EROFS, errno.EACCES):
                    raise

    def path(self, sha256: str) -> Path:
        return self.root / blob_relpath(sha256)

    def has(self, sha256: str) -> bool:
        return self.path(sha256).is_file()

    def stored_of(self, shas: Iterable[str]) -> set[str]:
        """Which of `shas` the store holds (s3.py answers from one listing, not a request each)."""
        return {sha for sha in shas if self.has(sha)}

    def locator(self, sha256: str) -> Path:
        """What serve's catalog names a stored blob by: its file here (s3.py: its object's key)."""
        return self.path(sha256)

    def part_path(self, key: str) -> Path:
        """Where an unfinished download of `key` (its expected sha256 or git oid) accumulates."""
        return self.tmp / f"{key}.part"

    @contextmanager
    def lock(self, key: str) -> Iterator[None]:
        """One writer per blob across processes and hosts: two stagers never share a `.part` file."""
        with ExitStack() as held:
            if self.shared_lock is not None:
                held.enter_context(self.shared_lock(f"blob {key}"))
            held.enter_context(FileLock(str(self.locks / f"{key}.lock")))
            yield

    def commit(self, part: Path, digest: Digest) -> Path:
        """Move a verified `.part` into the store under its sha256 (fsync, rename, fsync dir)."""
        with open(part, "rb") as f:
            os.fsync(f.fileno())
        final = self._move_in(part, digest)
        fsync_dir(final.parent)
        return final

    def commit_synced(self, parts: list[tuple[Path, Digest]]) -> None:
        """Move many verified `.part`s, each already fsynced by its writer, into the store: renames, then
        one fsync per shard directory they landed in (in parallel: each is mostly a wait on the disk)."""
        dirs = {self._move_in(part, digest).parent for part, digest in parts}
        if dirs:
            with ThreadPoolExecutor(max_workers=min(8, len(dirs))) as pool:
                list(pool.map(fsync_dir, sorted(dirs)))

    def _move_in(self, part: Path, digest: Digest) -> Path:
        final = self.path(digest.sha256)
        final.parent.mkdir(exist_ok=True)
        os.chmod(part, 0o444)  # views hard-link to it: nobody should edit a blob through a view
        os.replace(part, final)
        return final

    def sweep_parts(self, pattern: str, older_than_s: float = 600) -> None:
        """Drop unfinished files nobody will resume (older than any live writer's)."""
        cutoff = time.time() - older_than_s
        for p in self.tmp.glob(pattern):
            try:
                if p.stat().st_mtime < cutoff:
                    p.unlink()
            except FileNotFoundError:
                pass

    def remove(self, sha256: str, *keys: str) -> None:
        """Unlink a blob (gc) under the lock of every key a download of its content takes (its sha256,
        and the git oid a small file is fetched by): never from under a writer of the same bytes."""
        with self._locked(sha256, keys):
            self.path(sha256).unlink(missing_ok=True)

    @contextmanager
    def _locked(self, sha256: str, keys: tuple[str, ...]) -> Iterator[None]:
        with ExitStack() as held:
            for key in sorted({sha256, *keys}):
                held.enter_context(self.lock(key))
            yield

    def open(self, sha256: str) -> BinaryIO:
        """A stored blob's bytes to read from the start (bundle; s3.py streams its object)."""
        return open(self.path(sha256), "rb")

    def stream(self, sha256: str) -> Iterator[bytes]:
        """A stored blob's bytes in chunks (s3.py: its object's, as they arrive)."""
        with self.open(sha256) as f:
            while chunk := f.read(CHUNK):
                yield chunk

    def digest(self, sha256: str) -> Digest:
        """Both hashes of a stored blob, read again (verify, and a blob stored but never recorded)."""
        return digest_file(self.path(sha256))

    def blobs(self) -> list[Path]:
        return sorted(p for p in self.root.glob("??/*") if p.is_file())

    def blob_shas(self) -> list[str]:
        """The names (sha256) of every blob stored, whatever holds them (s3.py lists objects)."""
        return [p.name for p in self.blobs()]

    def blob_stats(self) -> Iterator[tuple[str, int, tuple[int, int] | None]]:
        """Each stored blob's sha256, size and (device, inode) (None on an object store: no hard links)."""
        for path in self.blobs():
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            yield path.name, st.st_size, (st.st_dev, st.st_ino)
