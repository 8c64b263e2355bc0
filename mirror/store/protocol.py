"""The BlobStore protocol: what every caller may ask of a home's blob store, kept by two siblings, the
home's filesystem (files.py) and an S3-compatible object store (s3.py). Home.store chooses one.

Both keep the same promises: a blob is stored under its sha256 only once its bytes were verified (in the
scratch folder on this host, scratch.py), never replaced, and removed only under the locks a writer of
the same bytes takes. What only one of them can do is a capability, asked for and never guessed from the
store's kind: `files` (the blobs are files on this host: views hard-link them, nginx sends them) and
`objects` (the blobs are objects in a bucket: serve and nginx fetch them by presigned URLs). Exactly one
of the two is set.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Protocol

from .blobs import Digest
from .scratch import Scratch

if TYPE_CHECKING:
    from .files import FileBlobStore
    from .s3 import S3BlobStore


class BlobStore(Protocol):
    scratch: Scratch  # this host's tmp/ parts and per-blob locks, whichever store takes the bytes

    @property
    def where(self) -> str:
        """Where the blobs live, for messages: the home's store folder, or s3://BUCKET/PREFIX."""
        ...

    @property
    def files(self) -> FileBlobStore | None:
        """The blobs as files on this host's disk, or None (an object store: a home without views)."""
        ...

    @property
    def objects(self) -> S3BlobStore | None:
        """The blobs as objects that serve and nginx fetch by presigned URLs, or None (files)."""
        ...

    def has(self, sha256: str) -> bool: ...

    def stored_of(self, shas: Iterable[str]) -> set[str]:
        """Which of `shas` the store holds (an object store answers from one listing, not a request each)."""
        ...

    def locator(self, sha256: str) -> Path:
        """What serve's catalog names a stored blob by: its file, or its object's key (never opened)."""
        ...

    def commit(self, part: Path, digest: Digest) -> None:
        """Store a verified `.part` under its sha256; the part is gone afterwards (moved in, or uploaded
        and removed). A blob already stored is another writer's same bytes, and stays."""
        ...

    def commit_synced(self, parts: list[tuple[Path, Digest]]) -> None:
        """commit() for many parts, each already fsynced by its writer (an import's)."""
        ...

    def remove(self, sha256: str, *keys: str) -> None:
        """Take a blob out (gc) under the lock of every key a download of its content takes (its sha256,
        and the git oid a small file is fetched by): never from under a writer of the same bytes."""
        ...

    def open(self, sha256: str) -> BinaryIO:
        """A stored blob's bytes to read from the start (a bundle's member)."""
        ...

    def stream(self, sha256: str) -> Iterator[bytes]:
        """A stored blob's bytes in chunks, as they are read or arrive."""
        ...

    def digest(self, sha256: str) -> Digest:
        """Both hashes of a stored blob, read again (verify, and a blob stored but never recorded)."""
        ...

    def as_file(self, sha256: str) -> AbstractContextManager[Path]:
        """A stored blob as a file on this host while the `with` lasts: its own, or a copy fetched into
        tmp/ and removed after. Not verified on the way: a caller that reads it hashes it."""
        ...

    def blob_shas(self) -> list[str]:
        """The names (sha256) of every blob stored."""
        ...

    def blob_stats(self) -> Iterator[tuple[str, int, tuple[int, int] | None]]:
        """Each stored blob's sha256, size and (device, inode): None on an object store (no hard links)."""
        ...

    # The ledger's records beside the blobs (store/row_records.py): small JSON documents by name, each
    # written whole or not at all (a file renamed into place, one PUT), replaced by a later write of it.
    def put_record(self, name: str, data: bytes) -> None: ...

    def read_record(self, name: str) -> bytes:
        """A record's bytes; RecordTooBig (a ValueError, as a damaged record's JSON is) past RECORD_MAX."""
        ...

    def drop_record(self, name: str) -> None:
        """Remove a record (gc's: a row that never committed); one already gone is no error."""
        ...

    def record_names(self) -> list[str]:
        """Every record's name, sorted."""
        ...

    def has_records(self) -> bool:
        """Whether the store holds any record: one look, not a listing."""
        ...
