"""A variant's `metadata.json` as the `kernels` library reads it: the one module that wraps its parser
and its digest (kernels 0.17: `kernels._rust.Metadata`, `Digest.hash_variant`, `Digest.validate`).

Why the library's own parser: the mirror must never stage what `kernels` would refuse to load (it
rejects, say, a `kernel-depends` entry spelled `repo_id`), and must read the publisher's digest by
the same rule `kernels verify-signature` applies — every file of the variant except `metadata.json`,
`metadata.json.sigstore` and `__pycache__/`, base64 of the raw sha256 — rather than a copy of it.
"""

from __future__ import annotations

import base64
import binascii
import importlib
import importlib.machinery
import importlib.util
import json
import sys
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from .errors import FrtError
from .gate import check_repo_id

if TYPE_CHECKING:
    from .resolution import FileEntry, Request

DIGEST_EXEMPT = ("metadata.json", "metadata.json.sigstore")


class MetadataInvalid(FrtError):
    """`kernels` cannot parse this metadata.json: it would not load the variant either."""


@dataclass(frozen=True)
class Dependency:
    """A `kernel-depends` entry: a repo and exactly one of a version or a revision."""

    repo: str
    version: int | None = None
    revision: str | None = None


@dataclass(frozen=True)
class KernelMetadata:
    depends: tuple[Dependency, ...]
    digest_algorithm: str | None  # "sha256"; None: the publisher recorded no digest
    digest: dict[str, str]  # path inside the variant -> hex sha256 (as the publisher computed it)
    python_depends: tuple[str, ...] = ()  # names in kernels' curated list (python_depends.py)
    raw: Any = field(default=None, compare=False, repr=False)  # the library's Metadata (untyped; validate_variant)
    source: bytes = field(default=b"", compare=False, repr=False)  # the metadata.json it was parsed from

    @property
    def has_digest(self) -> bool:
        return self.digest_algorithm is not None

    def expected_sha256(self, path_in_variant: str) -> str | None:
        return self.digest.get(path_in_variant)


_LOADING = threading.Lock()


def digest_exempt(path_in_variant: str) -> bool:
    return path_in_variant in DIGEST_EXEMPT or path_in_variant.split("/", 1)[0] == "__pycache__"


def kernels_rust() -> ModuleType:
    """`kernels._rust`, kernels' compiled parser and digest: the very module `kernels` itself runs."""
    if "kernels._rust" in sys.modules:
        return sys.modules["kernels._rust"]
    # One thread loads it: a PyO3 module initialised twice in a process (serve's fetch threads, all
    # parsing their first metadata.json at once) raises ImportError in the second.
    with _LOADING:
        return _load_kernels_rust()


def _load_kernels_rust() -> ModuleType:
    if "kernels._rust" in sys.modules or "kernels" in sys.modules:
        return importlib.import_module("kernels._rust")
    # Loaded from its file, not through the package: kernels' __init__ imports huggingface_hub's hf_api
    # (0.2 s, five times Python's start-up with click), which `verify` would pay for and never use.
    spec = importlib.util.find_spec("kernels")  # finds the package without running it
    for folder in (spec and spec.submodule_search_locations) or ():
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = Path(folder) / f"_rust{suffix}"
            rust = importlib.util.spec_from_file_location("kernels._rust", path) if path.is_file() else None
            if rust is not None and rust.loader is not None:
                module = importlib.util.module_from_spec(rust)
                sys.modules["kernels._rust"] = module  # a later `import kernels` takes this one, not a 2nd init
                rust.loader.exec_module(module)
                return module
    return importlib.import_module("kernels._rust")


def parse_metadata(doc: dict[str, Any] | bytes | None) -> KernelMetadata:
    """Parse with `kernels`; a variant without metadata.json has no digest and no dependencies."""
    if doc is None or doc == {}:
        return KernelMetadata((), None, {})
    raw = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    try:
        meta = kernels_rust().Metadata.from_bytes(raw)
    except (ValueError, OSError) as e:
        raise MetadataInvalid(f"kernels cannot parse metadata.json: {e}") from None
    deps = tuple(_dependency(d) for d in meta.kernel_depends)
    py = tuple(meta.python_depends)
    if meta.digest is None:
        return KernelMetadata(deps, None, {}, py, meta, raw)
    algorithm = str(meta.digest.algorithm).rsplit(".", 1)[-1].lower()
    files: dict[str, str] = {}
    for path, b64 in meta.digest.files.items():
        try:
            raw_hash = base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError):
            raise MetadataInvalid(f"metadata.json digest: {path}: not base64: {b64!r}") from None
        files[path] = raw_hash.hex() if algorithm == "sha256" else ""
    return KernelMetadata(deps, algorithm, files, py, meta, raw)


def validate_variant(meta: KernelMetadata, variant_dir: Path) -> list[str]:
    """Re-hash a variant directory and check it against the publisher's digest, by kernels' rule
    (every violation: a missing file, an unknown one, a hash that differs). [] when it holds."""
    if not meta.has_digest:
        return []
    rust = kernels_rust()
    current = rust.Digest.hash_variant(meta.raw.digest.algorithm, variant_dir)
    try:
        meta.raw.digest.validate(current)
    except rust.DigestValidationError as e:
        return [str(v) for v in e.violations]
    return []


def validate_listing(meta: KernelMetadata, listing: Mapping[str, str]) -> list[str] | None:
    """validate_variant's verdict on a variant directory laid out as exactly `listing` (path inside it ->
    hex sha256 of bytes verified as they were stored), without reading them again: kernels' own
    Digest.validate, handed the digest those hashes make (the publisher's metadata.json with its digest's
    files replaced). None where it cannot stand in for a re-hash: a digest algorithm other than sha256."""
    if not meta.has_digest:
        return []
    if meta.digest_algorithm != "sha256":
        return None
    rust = kernels_rust()
    doc = json.loads(meta.source)
    doc["digest"] = dict(
        doc["digest"],
        files={
            rel: base64.b64encode(bytes.fromhex(sha)).decode() for rel, sha in listing.items() if not digest_exempt(rel)
        },
    )
    try:
        meta.raw.digest.validate(rust.Metadata.from_bytes(json.dumps(doc).encode()).digest)
    except rust.DigestValidationError as e:
        return [str(v) for v in e.violations]
    return []


ON_FILES = "its digest ({}) is checked on files, and an object store has none here"


def listing_verdict(meta: KernelMetadata, pairs: Iterable[tuple[FileEntry, str]], variant: str) -> list[str] | None:
    """validate_listing on the variant directory `pairs` lay out (each file, the sha256 of its verified
    blob): stage judges a view before it is linked, verify a staged one again, from the same hashes."""
    prefix = f"build/{variant}/"
    listing = {f.path[len(prefix) :] if f.path.startswith(prefix) else f.path: sha for f, sha in pairs}
    return validate_listing(meta, listing)


def _dependency(dep: Any) -> Dependency:  # a kernel-depends entry of kernels' (untyped) Metadata
    v = dep.version
    if hasattr(v, "version"):
        return Dependency(dep.repo_id, version=int(v.version))
    return Dependency(dep.repo_id, revision=str(v.revision))


def dependency_request(dep: Dependency, environ: Mapping[str, str] | None = None) -> Request:
    """A `kernel-depends` entry as the request to resolve (a pin on the dependency still wins)."""
    from .resolve import make_request

    # make_request, so a publisher's repo id and revision pass the gate as a user's do.
    return make_request(
        check_repo_id(dep.repo, where="a kernel-depends entry"),
        version=dep.version,
        revision=dep.revision,
        environ=environ,
    )
