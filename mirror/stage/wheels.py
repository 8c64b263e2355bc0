"""The wheels a staged variant's `python-depends` need on its target, fetched, verified and stored.

For each staged variant whose metadata.json names python-depends: kernels' list says which packages
(frt.resolver.python_depends), wheel_pick which wheel of each fits the target, and each wheel's own
Requires-Dist are followed the same way. Every wheel is checked against the sha256 the index gives
for it before it enters the store (content-addressed, beside the kernels' blobs), and, where the home has
views, it is linked under `views/wheels/<filename>`: a flat folder that is pip's `--find-links` (env,
export-cache; on an object store env --into writes it). `serve` lists the stored wheels at `/simple/`.
"""

from __future__ import annotations

import os
import threading
import zipfile
from pathlib import Path
from urllib.parse import urlsplit

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from frt.resolver import wire
from frt.resolver.errors import BadInput, FrtError, UpstreamMalformed
from frt.resolver.hub import HubClient
from frt.resolver.pacing import Pacer
from frt.resolver.python_depends import packages_for
from frt.resolver.resolution import Resolution
from frt.resolver.settings import env_number
from frt.resolver.wheel_index import PYPI_SIMPLE, IndexFile, read_project
from frt.resolver.wheel_pick import pick, requires

from ..store.blobs import Digest, digest_file
from ..store.protocol import BlobStore
from ..store.records import WheelRecord
from .transport import local_file

INDEX_ENV = "FRT_WHEEL_INDEX"
MAX_WHEEL_ENV = "FRT_MAX_WHEEL_BYTES"
MAX_WHEEL = 4 << 30  # nvidia-cutlass-dsl's wheels are ~100 MB; a body past this is refused
MAX_CLOSURE = 200  # wheels of one variant, all its requirements together


class NoWheel(FrtError):
    """A python-depends package (or one it requires) has no wheel the target's cluster can install."""


def default_index(option: str | None = None) -> str:
    url = option or os.environ.get(INDEX_ENV) or PYPI_SIMPLE
    if not url.startswith(("http://", "https://")):
        raise BadInput(f"wheel index {url!r} is not an http(s) URL ({'--wheel-index' if option else INDEX_ENV})")
    return url


class WheelStager:
    """One stage run's wheel work: index pages read once per project, each wheel fetched once, shared
    by the variants and targets that need it (threads of one run may ask at once)."""

    def __init__(self, store: BlobStore, hub: HubClient, index: str):
        self.store, self.hub, self.index = store, hub, index
        self._pages: dict[str, list[IndexFile]] = {}
        self._stored: dict[str, tuple[WheelRecord, bytes]] = {}  # filename -> (record, METADATA)
        self._lock = threading.Lock()
        self.downloaded = 0
        self.digests: dict[str, Digest] = {}  # what it stored or found stored, for the ledger's blobs

    def for_variant(self, r: Resolution, python_depends: tuple[str, ...]) -> list[WheelRecord]:
        """Every wheel the variant's python-depends need on r's target, stored; NoWheel where one has
        none, UnsupportedDependency where kernels knows no such dependency."""
        if not python_depends:
            return []
        from kernels.backends import parse_backend

        packages = packages_for(python_depends, parse_backend(r.target.backend).name)
        queue: list[tuple[Requirement, str | None]] = [(Requirement(p.project), None) for p in packages]
        out: dict[str, WheelRecord] = {}
        while queue:
            req, wanted_by = queue.pop(0)
            name = canonicalize_name(req.name)
            if name in out:
                continue
            chosen = pick(self._page(name), r.target, req)
            if chosen is None:
                raise NoWheel(_no_wheel_line(r, req, self.index, wanted_by))
            record, metadata = self._stored_wheel(chosen.file, chosen.project, chosen.version)
            out[name] = record
            if len(out) > MAX_CLOSURE:
                raise UpstreamMalformed(f"{r.repo}: python-depends need over {MAX_CLOSURE} wheels; stopped")
            queue += [(dep, record.filename) for dep in requires(metadata, r.target)]
        return sorted(out.values(), key=lambda w: w.filename)

    def _page(self, project: str) -> list[IndexFile]:
        with self._lock:
            if project in self._pages:
                return self._pages[project]
        files = self.hub.ask(
            lambda: read_project(self.index, project, self.hub.limits, pacer=self.hub.pacer),
            host=self.index,
            where=f"index {self.index} project {project}",
        )
        with self._lock:
            self._pages[project] = files
        return files

    def _stored_wheel(self, f: IndexFile, project: str, version: str) -> tuple[WheelRecord, bytes]:
        with self._lock:
            if f.filename in self._stored:
                return self._stored[f.filename]
        with self.store.scratch.lock(f.sha256):
            digest, metadata = self._read_stored(f) if self.store.has(f.sha256) else self._download(f)
        record = WheelRecord(f.filename, project, version, f.sha256, digest.size)
        with self._lock:
            self._stored[f.filename] = (record, metadata)
            self.digests[f.sha256] = digest
        return record, metadata

    def _read_stored(self, f: IndexFile) -> tuple[Digest, bytes]:
        """A wheel already stored: its bytes hashed again (they may have changed since) and its METADATA."""
        with self.store.as_file(f.sha256) as path:
            digest = digest_file(path)
            if digest.sha256 != f.sha256:
                raise UpstreamMalformed(f"stored wheel {f.filename} ({f.sha256}) is corrupt: run 'frt-mirror verify'")
            return digest, wheel_metadata(path, f.filename)

    def _download(self, f: IndexFile) -> tuple[Digest, bytes]:
        """The wheel fetched, checked against the index's sha256 and stored; read before it is stored,
        since the store may take the file away (an object store uploads it)."""
        cap = f.size if f.size is not None else env_number(MAX_WHEEL_ENV, MAX_WHEEL, int)
        part = self.store.scratch.part_path(f.sha256)
        self.hub.ask(
            lambda: _get_to(f.url, part, cap, self.hub.limits, self.hub.pacer),
            host=self.index,
            where=f"wheel {f.filename}",
        )
        got = digest_file(part)
        if got.sha256 != f.sha256:
            part.unlink(missing_ok=True)
            raise UpstreamMalformed(
                f"wheel {f.filename}: its sha256 is {got.sha256}, the index says {f.sha256}; not stored"
            )
        try:
            metadata = wheel_metadata(part, f.filename)
        except UpstreamMalformed:
            part.unlink(missing_ok=True)
            raise
        self.store.commit(part, got)
        self.downloaded += got.size
        return got, metadata


def _get_to(url: str, part: Path, cap: int, limits: wire.Limits, pacer: Pacer) -> None:
    """GET a wheel's body into `part` (anew each attempt), at most `cap` bytes, under the deadline."""
    if urlsplit(url).scheme not in ("http", "https"):  # an index's link may point anywhere
        raise UpstreamMalformed(f"wheel at {url!r}: not an http(s) URL; not fetched")
    deadline = limits.deadline(cap if cap < (1 << 30) else 0)
    with wire.stream(url, headers={}, deadline=deadline, pacer=pacer) as r:
        wire.raise_for_status(r, deadline)
        written = 0
        with local_file(part, "wb") as out:
            for chunk in r.iter_bytes():
                written += len(chunk)
                if written > cap:
                    raise UpstreamMalformed(f"{url}: more than {cap} bytes ({MAX_WHEEL_ENV}); stopped")
                out.write(chunk)
                deadline.check(url)


def wheel_metadata(path: Path, filename: str) -> bytes:
    """The wheel's `.dist-info/METADATA` (its Requires-Dist); a file that is not a wheel is refused."""
    name, version, _, _ = parse_wheel_filename(filename)
    try:
        with zipfile.ZipFile(path) as z:
            infos = [
                i for i in z.infolist() if i.filename.endswith(".dist-info/METADATA") and i.filename.count("/") == 1
            ]
            if len(infos) != 1 or infos[0].file_size > 16 << 20:
                raise UpstreamMalformed(f"wheel {filename}: no single .dist-info/METADATA in it")
            return z.read(infos[0])
    except (zipfile.BadZipFile, OSError) as e:
        raise UpstreamMalformed(f"wheel {filename}: not a readable zip ({e})") from None


def _no_wheel_line(r: Resolution, req: Requirement, index: str, wanted_by: str | None) -> str:
    t = r.target
    kinds = (
        ("py3-none-any only: name the cluster's Python (python = \"3.12\" in the manifest's target) for binary wheels")
        if t.python is None
        else f"Python {t.python}, {t.os} {t.cpu}"
    )
    of = f" (required by {wanted_by})" if wanted_by else ""
    return f"{r.repo}@{r.commit[:12]} {r.variant}: python-depends: no wheel of {req}{of} on {index} fits {t} ({kinds})"
