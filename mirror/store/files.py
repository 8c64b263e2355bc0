"""The blob store on the home's filesystem: files by sha256 under `store/sha256/`, read-only, moved in
whole from tmp/ (fsynced, renamed, the folder fsynced), hard-linked into the views (view_trees.py) and sent
by nginx as they lie (serve --accel-redirect)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from frt.resolver.fs import atomic_write, fsync_dir

from ..home_path import HomeLayout
from .blobs import CHUNK, Digest, blob_relpath, digest_file
from .record_size import RECORD_MAX, RecordTooBig
from .scratch import Scratch, SharedLock


def store_root(home: Path) -> Path:
    """The folder a home's blobs lie under as files (nginx-conf aliases its internal location onto it)."""
    return HomeLayout(home).store


class FileBlobStore:
    """A BlobStore (protocol.py) whose blobs are files on this host. Opening one makes no folder: the
    first blob moved in does (a command given the wrong --home creates nothing there)."""

    def __init__(self, home: Path, shared_lock: SharedLock | None = None):
        self.root = store_root(home)
        self.records = HomeLayout(home).records
        self.scratch = Scratch(home, shared_lock)

    @property
    def where(self) -> str:
        return str(self.root.parent)

    @property
    def files(self) -> FileBlobStore:
        return self

    @property
    def objects(self) -> None:
        return None

    def path(self, sha256: str) -> Path:
        return self.root / blob_relpath(sha256)

    def has(self, sha256: str) -> bool:
        return self.path(sha256).is_file()

    def stored_of(self, shas: Iterable[str]) -> set[str]:
        return {sha for sha in shas if self.has(sha)}

    def locator(self, sha256: str) -> Path:
        return self.path(sha256)

    def commit(self, part: Path, digest: Digest) -> None:
        """Move a verified `.part` into the store under its sha256 (fsync, rename, fsync dir)."""
        with open(part, "rb") as f:
            os.fsync(f.fileno())
        fsync_dir(self._move_in(part, digest).parent)

    def commit_synced(self, parts: list[tuple[Path, Digest]]) -> None:
        """Renames, then one fsync per shard directory they landed in (in parallel: each is mostly a wait
        on the disk)."""
        dirs = {self._move_in(part, digest).parent for part, digest in parts}
        if dirs:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(max_workers=min(8, len(dirs))) as pool:
                list(pool.map(fsync_dir, sorted(dirs)))

    def _move_in(self, part: Path, digest: Digest) -> Path:
        final = self.path(digest.sha256)
        final.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(part, 0o444)  # views hard-link to it: nobody should edit a blob through a view
        os.replace(part, final)
        return final

    def remove(self, sha256: str, *keys: str) -> None:
        with self.scratch.lock(sha256, *keys):
            self.path(sha256).unlink(missing_ok=True)

    def open(self, sha256: str) -> BinaryIO:
        return open(self.path(sha256), "rb")

    def stream(self, sha256: str) -> Iterator[bytes]:
        with self.open(sha256) as f:
            while chunk := f.read(CHUNK):
                yield chunk

    def digest(self, sha256: str) -> Digest:
        return digest_file(self.path(sha256))

    @contextmanager
    def as_file(self, sha256: str) -> Iterator[Path]:
        yield self.path(sha256)

    def blob_shas(self) -> list[str]:
        return [p.name for p in self._blob_files()]

    def blob_stats(self) -> Iterator[tuple[str, int, tuple[int, int] | None]]:
        for path in self._blob_files():
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            yield path.name, st.st_size, (st.st_dev, st.st_ino)

    def _blob_files(self) -> list[Path]:
        return sorted(p for p in self.root.glob("??/*") if p.is_file())

    def put_record(self, name: str, data: bytes) -> None:
        atomic_write(self.records / name, data)  # fsynced, renamed into place, the folder fsynced

    def read_record(self, name: str) -> bytes:
        with open(self.records / name, "rb") as f:
            data = f.read(RECORD_MAX + 1)
        if len(data) > RECORD_MAX:
            raise RecordTooBig(name, os.stat(self.records / name).st_size)
        return data

    def drop_record(self, name: str) -> None:
        (self.records / name).unlink(missing_ok=True)
        fsync_dir(self.records)

    def record_names(self) -> list[str]:
        return sorted(p.name for p in self.records.glob("*.json") if p.is_file())

    def has_records(self) -> bool:
        return next(self.records.glob("*.json"), None) is not None
