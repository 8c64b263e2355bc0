"""The domain objects a resolution produces: decisions are data, rendered afterwards."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from .archs import declared_archs
from .errors import BadInput, Refused
from .targets import Target


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative to the repo root, e.g. build/torch-universal/__init__.py
    size: int
    git_oid: str
    sha256: str | None = None  # advertised by upstream for LFS files; else computed when staged


@dataclass(frozen=True)
class CommitInfo:
    """One commit as upstream's history lists it (the Hub names no parents)."""

    sha: str
    date: datetime | None
    title: str


def parent_chain(parents: Mapping[str, str | None], head: str) -> list[str]:
    """`head` and the commits its recorded parents lead back to, newest first. Only an old record
    (a v4 ledger, a format-1 bundle) has parents: each was the next entry of the upstream's list, so
    the chain replays that list, which is what it is now kept as."""
    out: list[str] = []
    seen: set[str] = set()
    cur: str | None = head
    while cur is not None and cur in parents and cur not in seen:
        out.append(cur)
        seen.add(cur)
        cur = parents[cur]
    return out


@dataclass(frozen=True)
class VariantInfo:
    """One build variant directory at a commit, as upstream lists it."""

    name: str
    files: tuple[FileEntry, ...]
    metadata_oid: str | None = None
    metadata: dict[str, Any] | None = None  # its metadata.json, a JSON object


@dataclass(frozen=True)
class Request:
    """What the user asked for. A pin (FRT_KERNEL_REV_<ID>) replaces version and revision."""

    repo: str
    version: int | None = None
    revision: str | None = None
    pinned: bool = False

    def __post_init__(self) -> None:
        if (self.version is None) == (self.revision is None):
            raise ValueError("a request names exactly one of version or revision")

    @property
    def label(self) -> str:
        if self.version is not None:
            return f"v{self.version}"
        return f"pin {self.revision}" if self.pinned else f"revision {self.revision}"


@dataclass(frozen=True)
class Resolution:
    request: Request
    target: Target
    commit: str
    variant: str
    files: tuple[FileEntry, ...]
    metadata: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def repo(self) -> str:
        return self.request.repo

    def to_json(self) -> dict[str, Any]:
        return {
            "repo": self.repo,
            "requested": self.request.label,
            "target": str(self.target),
            "target_archs": list(self.target.archs),
            "commit": self.commit,
            "variant": self.variant,
            "files": [asdict(f) for f in self.files],
            "archs": declared_archs(self.metadata),
            "kernel_depends": declared_depends(self.metadata),
        }


def declared_depends(metadata: object) -> list[object]:
    """A metadata.json's `kernel-depends` list, [] when it has none or it is not a list."""
    deps = metadata.get("kernel-depends") if isinstance(metadata, dict) else None
    return deps if isinstance(deps, list) else []


@dataclass(frozen=True)
class Refusal:
    """Why `request` cannot be served for `target`, and what would serve it instead.

    `detail` keeps the original failure text verbatim (the variant trace in the
    `kernels` library's wording, or the upstream's error message).
    """

    request: Request
    target: Target
    error: str  # NoVariant | VersionNotFound | RevisionNotFound | RepoNotFound
    message: str
    detail: str = ""
    commit: str | None = None
    available: tuple[str, ...] = ()
    newest_with_target: str | None = None  # newest commit on the same version line that has it
    versions_with_target: tuple[int, ...] = ()
    declared: dict[str, list[str]] = field(default_factory=dict, compare=False)  # arch target: variant -> its archs
    # The request named a repository that is not there (RepoNotFound): the user's input, exit 2 as for any
    # bad input, though recorded as a refusal like the rest.
    bad_input: bool = False

    @property
    def repo(self) -> str:
        return self.request.repo

    def to_json(self) -> dict[str, Any]:
        return {
            "repo": self.repo,
            "requested": self.request.label,
            "version": self.request.version,
            "revision": self.request.revision,
            "target": str(self.target),
            "target_archs": list(self.target.archs),
            "error": self.error,
            "message": self.message,
            "detail": self.detail,
            "commit": self.commit,
            "available": list(self.available),
            "newest_commit_with_target": self.newest_with_target,
            "versions_with_target": list(self.versions_with_target),
            "declared_archs": self.declared,
        }


class KernelUnavailable(Refused, ValueError):
    """A kernel cannot be resolved for a target. `refusal` says why, and what would work."""

    def __init__(self, refusal: Refusal):
        super().__init__(refusal.message)
        self.refusal = refusal

    @staticmethod
    def of(refusal: Refusal) -> KernelUnavailable:
        """The error for `refusal`: a repository that is not there is bad input (exit 2) as well."""
        return UnknownRepo(refusal) if refusal.bad_input else KernelUnavailable(refusal)


class UnknownRepo(KernelUnavailable, BadInput):
    """The request named a repository the upstream (or, offline, the ledger) does not have."""
