"""What a blob is, whichever store holds it (files.py, s3.py): its bytes' two hashes, taken in one read
(digest_file) or as a download is written (RunningDigest), and its name under a store (blob_relpath).

A blob enters a store only after its bytes matched what upstream advertised (sha256 for LFS files, the
git blob sha1 for small ones). Until then it lives in tmp/ as a `.part` file (scratch.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from frt.resolver.resolution import FileEntry

CHUNK = 1 << 20


@dataclass(frozen=True)
class Digest:
    sha256: str
    git_oid: str
    size: int


def listed_blobs(entries: Iterable[FileEntry], by_git_oid: Mapping[str, str]) -> dict[FileEntry, str | None]:
    """Which stored blob each listed file is (its sha256), or None where none is recorded, given the recorded
    blobs' sha256 by git oid. The one place of this rule: an LFS file is known by the sha256 the upstream
    advertised; a small file only by its git oid, so by the blob recorded under that oid when it was staged."""
    return {f: f.sha256 or by_git_oid.get(f.git_oid) for f in entries}


def digest_file(path: Path) -> Digest:
    """sha256 and git blob sha1 of a file in one read."""
    size = path.stat().st_size
    import hashlib  # here: a home that is only read (env on a job start) hashes nothing

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
        import hashlib

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


def blob_relpath(sha256: str) -> str:
    """Where a blob lies under either store's root: `<sha[:2]>/<sha>` under `store/sha256/` (what nginx's
    internal location over the store is asked for: serve --accel-redirect), or under `PREFIX/sha256/`."""
    return f"{sha256[:2]}/{sha256}"
