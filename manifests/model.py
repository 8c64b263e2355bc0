"""The parsed shape of a staging manifest, whatever file it came from, and its one error type."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

KINDS = ("frt", "pyproject", "kernels.lock")


class ManifestError(ValueError):
    """Bad manifest input. ``str(e)`` is one line: ``<file>:<line>: <field>: <what is wrong>``.

    ``line`` is ``None`` only when no line can be known (a missing table, an unreadable file);
    the message is then ``<file>: <field>: <what is wrong>``. The parts stay available as
    attributes so a caller can re-render them (e.g. as JSON).
    """

    def __init__(self, file: str | Path, line: int | None, field: str, what: str):
        self.file, self.line, self.field, self.what = str(file), line, field, what
        # Multi-line text from a library (a JSON/TOML message) must not break the one-line contract.
        what = " ".join(what.split())
        where = self.file if line is None else f"{self.file}:{line}"
        super().__init__(f"{where}: {field}: {what}")

    def __reduce__(self) -> tuple[type[ManifestError], tuple[str, int | None, str, str]]:
        # keep it picklable (multiprocessing workers) despite the 4-arg __init__
        return (type(self), (self.file, self.line, self.field, self.what))


@dataclass(frozen=True)
class TargetSpec:
    """One build target, as written: either a target string (``text``) or its four fields.

    Nothing here checks that the backend or torch version exists; the resolver does that, and
    ``source`` ("file:line") lets it point back at the manifest line.
    """

    name: str | None = None
    text: str | None = None
    torch: str | None = None
    backend: str | None = None
    cpu: str | None = None
    os: str | None = None
    source: str = ""
    archs: tuple[str, ...] | None = None  # the fleet's GPU archs (``archs = ["8.0", "9.0"]``), checked by the resolver
    python: str | None = None  # the cluster's Python (``python = "3.12"``): binary wheels for python-depends
    # Each field as written (target, torch, backend, cpu, os, archs, python) -> "file:line: targets[0].os", the
    # start of an error about it, so that one found later (an unknown os) points at its line, not [[targets]]'s.
    where: Mapping[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        fields = (self.torch, self.backend, self.cpu, self.os)
        if (self.text is not None and fields != (None,) * 4) or (self.text is None and None in fields):
            raise ValueError("TargetSpec needs either text or all of torch/backend/cpu/os, not both")

    @property
    def as_string(self) -> str:
        """The target string, ``torch<M>.<m>-<backend>-<cpu>-<os>[@ARCH,...]`` (or ``text`` verbatim, + archs)."""
        at = f"@{','.join(self.archs)}" if self.archs else ""
        if self.text is not None:
            return self.text + at
        return f"torch{self.torch}-{self.backend}-{self.cpu}-{self.os}{at}"


@dataclass(frozen=True)
class KernelSpec:
    """A kernel repo to stage, at a version (``v<N>`` branch) or an exact revision — exactly one.

    ``locked_version`` is set only for kernels.lock entries: the version the lock was taken from,
    kept for display; ``revision`` (the locked commit) is what counts.
    """

    repo: str
    version: int | None = None
    revision: str | None = None
    source: str = ""
    locked_version: int | None = None

    def __post_init__(self) -> None:
        if (self.version is None) == (self.revision is None):
            raise ValueError(f"KernelSpec({self.repo!r}) needs exactly one of version or revision")


@dataclass(frozen=True)
class ModelSpec:
    """A model repo to stage: the files of ``revision`` (a branch, tag or commit) that ``include``
    and ``exclude`` select, by snapshot_download's rule (fnmatch; a file is kept when it matches an
    include pattern, or there are none, and no exclude pattern; a pattern ending in '/' means the
    folder's contents)."""

    repo: str
    revision: str = "main"
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    source: str = ""


@dataclass(frozen=True)
class Trust:
    """Trust policy: publisher orgs whose kernels may be staged. ``declared`` is False when the
    manifest had no trust table at all, so the caller can apply its own default."""

    publishers: tuple[str, ...] = ()
    declared: bool = False


@dataclass(frozen=True)
class Manifest:
    path: Path
    kind: str  # one of KINDS
    targets: tuple[TargetSpec, ...]
    kernels: tuple[KernelSpec, ...]
    trust: Trust = Trust()
    models: tuple[ModelSpec, ...] = ()
