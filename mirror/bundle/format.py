"""The bundle archive: what its members are, what its manifest says, and the report both ends print.

A bundle is a plain tar: `frt-bundle.json` first (the manifest: the ledger rows that describe the
set, the list of blobs by sha256, size and git oid, the upstream's trustedKernelPublisher per org, and
for an incremental bundle its base), then `frt-bundle.sig` if it is signed (see frt.mirror.bundle.signing),
then `blobs/<sha256>` for every blob the manifest lists, and nothing else. The wheels of python-depends are
blobs like any other: the manifest's `wheels` names them (filename, project, version, sha256, size) and
each staged row its own (`wheels`, where it has some), so a reader that knows nothing of wheels reads
rows without any as it always did.

A bundle's id is the sha256 of its manifest member's bytes: an incremental bundle names its base by
it, and the events log records it on both sides of the gap.

Formats: 1 kept each commit's parent link; 2 keeps each head's history as the upstream listed it;
3 may name a base (`base`, see frt.mirror.bundle.state) and may carry a signature member. A reader of
format 2 would import an incremental bundle as if it were the whole set, so format 3 is refused there
rather than half-understood. 4 is an incremental bundle that carries removals (`unstaged`: the staged
rows its base held that the connected box has since unstaged); only such a bundle is written as 4, since
a reader of 3 would keep on the cluster what was taken away on the connected box. 5 is a bundle whose
staged rows need wheels (`wheels`, below); a reader of 4 would import the kernels without them, and they
would fail to load on the cluster, so only such a bundle is written as 5.
"""

from __future__ import annotations

import hashlib
import re
import tarfile
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from frt.resolver.errors import VerificationFailed

from ..store.blobs import CHUNK, Digest
from ..store.records import StagedRow

FORMAT = 3
UNSTAGES = 4  # the format of a bundle that carries removals
WHEELS = 5  # the format of a bundle whose rows need wheels (it may carry removals too)
READS = (1, 2, 3, 4, 5)
MANIFEST = "frt-bundle.json"
SIGNATURE = "frt-bundle.sig"
MAX_MANIFEST = 256 << 20  # read into memory: refuse a hostile giant before reading it
MAX_SIGNATURE = 64 << 10
BLOB = re.compile(r"blobs/([0-9a-f]{64})")
REGULAR = (tarfile.REGTYPE, tarfile.AREGTYPE)  # never links, devices or dirs


class BundleRejected(VerificationFailed):
    """A bundle that cannot be written or trusted; on import, nothing of it was kept (exit 1)."""


def bundle_id(manifest: bytes) -> str:
    return hashlib.sha256(manifest).hexdigest()


@dataclass
class BundleReport:
    path: Path
    blobs: int
    bytes: int
    staged: list[StagedRow]
    id: str = ""
    base: str | None = None  # an incremental bundle's base id
    base_name: str | None = None
    signed_by: str | None = None  # the key id that signed it (import: checked only with --require-signature)
    new_blobs: int | None = None  # import only: blobs this home did not have
    new_rows: int | None = None  # import only: staged rows added or changed
    unstaged: list[list[str]] = field(default_factory=list)  # [repo, requested, target] carried as removals
    skipped: list[StagedRow] = field(default_factory=list)  # import only: withdrawn here since it was written

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": True,
            "bundle": str(self.path),
            "id": self.id,
            "base": self.base,
            "base_name": self.base_name,
            "signed_by": self.signed_by,
            "blobs": self.blobs,
            "bytes": self.bytes,
            "new_blobs": self.new_blobs,
            "new_rows": self.new_rows,
            "staged": [r.to_json() for r in self.staged],
            "unstaged": [dict(zip(("repo", "requested", "target"), k, strict=False)) for k in self.unstaged],
            "skipped": [r.to_json() for r in self.skipped],
        }


SHA256_HELPER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="frt-sha256")  # one: a file's chunks in order


class Hashing:
    """A reader that hashes what passes through it: sha256, and the git blob sha1 that small
    files are known by (its header needs the size up front: a wrong size shows as a wrong oid).
    `on_bytes` hears of every chunk (a progress meter).

    Both hashes of every byte, from the one read: sha256 runs on a helper thread, one chunk behind the
    caller, while the caller's thread does the sha1 and writes the chunk out (hashlib lets go of the GIL
    on large buffers), so a bundle being written hashes at the pace of the slower of the two, not of
    their sum (bench/bundle.py)."""

    def __init__(self, f: BinaryIO, size: int, on_bytes: Callable[[int], None] | None = None):
        self.f, self.seen, self.on_bytes = f, 0, on_bytes
        self.h256, self.hgit = hashlib.sha256(), hashlib.sha1(f"blob {size}\0".encode())
        self._pending: Future[None] | None = None

    def read(self, n: int = CHUNK) -> bytes:
        chunk = self.f.read(n)
        if self._pending is not None:
            self._pending.result()
        self._pending = SHA256_HELPER.submit(self.h256.update, chunk) if len(chunk) >= 1 << 16 else None
        if self._pending is None:
            self.h256.update(chunk)
        self.hgit.update(chunk)
        self.seen += len(chunk)
        if self.on_bytes:
            self.on_bytes(len(chunk))
        return chunk

    def digest(self) -> Digest:
        if self._pending is not None:
            self._pending.result()
            self._pending = None
        return Digest(self.h256.hexdigest(), self.hgit.hexdigest(), self.seen)


def read_head(
    tf: tarfile.TarFile, members: Iterator[tarfile.TarInfo]
) -> tuple[bytes, bytes | None, tarfile.TarInfo | None]:
    """The manifest's bytes, the signature member's (None: unsigned) and the first blob member (or None),
    read from the start of an archive being streamed, before any blob."""
    first = next(members, None)
    if first is None or first.name != MANIFEST or first.type not in REGULAR or first.size > MAX_MANIFEST:
        raise BundleRejected(f"the first member must be a regular file named {MANIFEST}")
    manifest = _read(tf, first)
    second = next(members, None)
    if second is None or second.name != SIGNATURE:
        return manifest, None, second
    if second.type not in REGULAR or second.size > MAX_SIGNATURE:
        raise BundleRejected(f"{SIGNATURE} must be a small regular file")
    return manifest, _read(tf, second), next(members, None)


def _read(tf: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    f = tf.extractfile(member)
    assert f is not None  # extractfile is None only for a member that is not a file; callers checked REGULAR
    return f.read()
