"""Which wheel of a project a target's cluster can install, and what that wheel requires in turn.

pip on the cluster chooses among the wheels it is given by its own tags; the mirror must hand it one
that fits, without running there. What a target says of the cluster decides which tags those are:

- always: pure-Python wheels, `py3-none-any` (and `py2.py3-none-any`);
- with a Python named (a manifest target's `python = "3.12"`; `host`: this interpreter): CPython's own
  tags for that Python (`cp312-cp312-…`, `cp312-abi3-…`, down to `cp32-abi3`) on the target's platform,
  by packaging's tag rules, and `py312-none-any`. Platforms: Linux manylinux 2.17 to 2.28 (torch's own
  wheels need glibc 2.28 since 2.6, so a cluster that runs torch has it), macOS 11 to 15 on arm64 (and
  universal2), Windows amd64.

Of the wheels that fit, the newest release satisfying the requirement wins (pre-releases and yanked
files only where nothing else does, as pip), and within it the most specific tag. Requires-Python is
held to the named Python; without one it cannot be judged, and pip on the cluster will.

A wheel's own Requires-Dist are followed (environment markers evaluated for the target; without a
Python named, a marker on the Python version counts if it holds for any 3.9 to 3.14, so nothing the
cluster needs is left out) except torch, which the target itself names: the kernel runs on its torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from email.parser import BytesParser

from packaging.markers import InvalidMarker, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from .targets import Target
from .wheel_index import IndexFile

PROVIDED = frozenset({"torch"})  # the target's own framework: never fetched as a dependency
_PY_GUESSES = tuple(f"3.{m}" for m in range(9, 15))
_MANYLINUX = range(28, 16, -1)  # glibc 2.28 .. 2.17, newest first (pip's order)
_MACOS = range(15, 10, -1)
_MACHINE = {
    ("linux", "x86_64"): "x86_64",
    ("linux", "aarch64"): "aarch64",
    ("darwin", "aarch64"): "arm64",
    ("darwin", "x86_64"): "x86_64",
    ("windows", "x86_64"): "AMD64",
    ("windows", "aarch64"): "ARM64",
}
_SYS = {
    "linux": ("Linux", "linux", "posix"),
    "darwin": ("Darwin", "darwin", "posix"),
    "windows": ("Windows", "win32", "nt"),
}


@dataclass(frozen=True)
class Pick:
    project: str
    version: str
    file: IndexFile


def platforms(target: Target) -> list[str]:
    """The platform tags of the target's OS and CPU, most specific first."""
    if target.os == "linux":
        arch = target.cpu
        return [f"manylinux_2_{m}_{arch}" for m in _MANYLINUX] + [f"manylinux2014_{arch}"]
    if target.os == "darwin":
        arch = "arm64" if target.cpu == "aarch64" else target.cpu
        return [p for m in _MACOS for p in (f"macosx_{m}_0_{arch}", f"macosx_{m}_0_universal2")]
    return ["win_amd64" if target.cpu == "x86_64" else "win_arm64"]


def supported_tags(target: Target) -> list[Tag]:
    """The tags a wheel for this target may carry, most preferred first."""
    pure = [Tag("py3", "none", "any")]
    if target.python is None:
        return pure
    version = tuple(int(x) for x in target.python.split("."))
    plats = platforms(target)
    return [*cpython_tags(version, platforms=plats), *compatible_tags(version, platforms=plats)] + pure


def pick(files: list[IndexFile], target: Target, requirement: Requirement) -> Pick | None:
    """The wheel of `requirement`'s project the cluster should get, or None where none fits."""
    rank = {tag: i for i, tag in enumerate(supported_tags(target))}
    python = Version(target.python) if target.python else None
    candidates = []
    for f in files:
        try:
            name, version, _, tags = parse_wheel_filename(f.filename)
        except InvalidWheelFilename:
            continue  # an sdist, or not a wheel
        fits = [rank[t] for t in tags if t in rank]
        if name != canonicalize_name(requirement.name) or not fits or not _python_ok(f, python):
            continue
        if requirement.specifier and not requirement.specifier.contains(version, prereleases=True):
            continue
        candidates.append(((f.yanked, version.is_prerelease), version, -min(fits), f))
    if not candidates:
        return None
    final = [c for c in candidates if not c[0][0] and not c[0][1]] or candidates
    _, version, _, best = max(final, key=lambda c: (c[1], c[2]))
    return Pick(canonicalize_name(requirement.name), str(version), best)


def _python_ok(f: IndexFile, python: Version | None) -> bool:
    if python is None or not f.requires_python:
        return True
    try:
        return SpecifierSet(f.requires_python).contains(python, prereleases=True)
    except InvalidSpecifier:
        return True  # pip ignores a Requires-Python it cannot parse


def requires(metadata: bytes, target: Target) -> list[Requirement]:
    """A wheel's Requires-Dist (its METADATA's bytes) that the target's cluster needs, torch aside."""
    msg = BytesParser().parsebytes(metadata, headersonly=True)
    out = []
    for line in msg.get_all("Requires-Dist") or []:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue  # pip would fail on it too; the cluster's pip says so
        if canonicalize_name(req.name) in PROVIDED or not _marker_holds(req, target):
            continue
        out.append(req)
    return out


def _marker_holds(req: Requirement, target: Target) -> bool:
    if req.marker is None:
        return True
    system, sys_platform, os_name = _SYS[target.os]
    base = {
        "platform_system": system,
        "sys_platform": sys_platform,
        "os_name": os_name,
        "platform_machine": _MACHINE.get((target.os, target.cpu), target.cpu),
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "extra": "",
    }
    for py in (target.python,) if target.python else _PY_GUESSES:
        try:
            if req.marker.evaluate({**base, "python_version": py, "python_full_version": f"{py}.0"}):
                return True
        except (InvalidMarker, UndefinedEnvironmentName):
            return True  # a marker we cannot judge: fetch it (a spare wheel costs less than a failed install)
    return False
