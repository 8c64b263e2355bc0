"""GPU archs: the ones a target names, and whether a build's declared archs cover them, by the
`kernels` library's own rule. The only module that touches `kernels.archs` (its answers remembered per
installation: decisions_memo.py).

Why here and not at load: kernels 0.17 picks a variant by its name, and only then checks the build's
metadata.json `backend.archs` against the device (`kernels.archs._check_arch_incompatibility`), raising
`RuntimeError … does not support the current device` rather than trying the next variant. A fleet of A100s
(8.0) and H100s (9.0) handed a build that declares only 9.0 learns that on the far side of the air gap;
the mirror can know it before, from the same metadata and the same rule.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from .decisions_memo import memo

_CUDA_ARCH = re.compile(r"(\d+)\.(\d+)")  # a device's compute capability, major.minor: no a/f/+PTX
_ROCM_ARCH = re.compile(r"gfx[0-9a-f]+")  # a device's gcnArchName, its feature flags stripped


def declared_archs(metadata: object) -> list[object] | None:
    """A metadata.json's `backend.archs`, or None: the upstream's document may be any JSON shape (kernels'
    parser refuses a bad one at stage; reading it for a listing must not fail first)."""
    backend = metadata.get("backend") if isinstance(metadata, dict) else None
    archs = backend.get("archs") if isinstance(backend, dict) else None
    return archs if isinstance(archs, list) else None


@dataclass(frozen=True)
class Declared:
    """What one build's metadata.json says of its device code: `backend.type` and `backend.archs`
    (None or empty: a noarch build, e.g. pure Triton, which kernels never rejects)."""

    backend: str | None
    archs: tuple[str, ...] | None

    @classmethod
    def of(cls, metadata: object) -> Declared:
        backend = metadata.get("backend") if isinstance(metadata, dict) else None
        kind = backend.get("type") if isinstance(backend, dict) else None
        archs = declared_archs(metadata)
        return cls(kind.lower() if isinstance(kind, str) else None, tuple(str(a) for a in archs) if archs else None)

    @property
    def label(self) -> str:
        return f"archs {', '.join(self.archs)}" if self.archs else "no archs"


NOARCH = Declared(None, None)


@dataclass(frozen=True)
class _Check:
    device: str  # the kind of device kernels checks this backend type's builds on
    what: tuple[str, str]  # kernels' word for the device's arch in its error text, and its plural
    supports: Callable[[tuple[str, ...], str], bool]


def _cuda_supports(archs: tuple[str, ...], arch: str) -> bool:
    return bool(memo().answer("cuda", [list(archs), arch], cuda_by_kernels)[0])


def cuda_by_kernels(archs: list[str], arch: str) -> list[bool]:
    """Whether a build declaring `archs` loads on a device of CUDA capability `arch`, by kernels itself."""
    from kernels.archs import _supports_cuda_capability

    major, minor = (int(x) for x in arch.split("."))
    return [bool(_supports_cuda_capability(archs, (major, minor)))]


# kernels.archs._check_arch_incompatibility, as data: a CUDA build is checked only on a CUDA device (by
# _supports_cuda_capability: a/f suffixes, +PTX, unknown formats), a ROCm build only on a ROCm device (the
# device's gcnArchName must be one of the archs; kernels has no function for it, only that `in`). Builds of
# every other backend type are never checked.
_CHECKS = {
    "cuda": _Check("cuda", ("CUDA capability", "CUDA capabilities"), _cuda_supports),
    "rocm": _Check("rocm", ("ROCm arch", "ROCm archs"), lambda archs, arch: arch in archs),
}
# The device a target's backend token runs on, where kernels checks archs at all.
_DEVICES = (("cu", "cuda"), ("rocm", "rocm"))


def device_of(backend: str) -> str | None:
    """'cuda' for cu<MM><m>, 'rocm' for rocm<M><m>; None for backends whose archs kernels never checks."""
    return next((device for prefix, device in _DEVICES if backend.startswith(prefix)), None)


def uncovered(device: str | None, archs: tuple[str, ...], declared: Declared) -> tuple[str, ...]:
    """The archs of a target on which kernels would refuse to load this build; () when it covers them all."""
    if not archs or not declared.archs:
        return ()
    check = _CHECKS.get(declared.backend or "")
    if check is None or check.device != device:
        return ()
    return tuple(a for a in archs if not check.supports(declared.archs, a))


def reason(device: str | None, missing: tuple[str, ...], declared: Declared) -> str:
    """Why a build is rejected for a target's archs, in kernels' own words (its RuntimeError's)."""
    one, many = _CHECKS[declared.backend or ""].what
    head, verb = (one, "is") if len(missing) == 1 else (many, "are")
    return f"{head} {', '.join(missing)} {verb} not supported by the architectures of the build: " + ", ".join(
        declared.archs or ()
    )


def normalize(backend: str, archs: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """A target's archs, checked and in one canonical order (so its string is its identity); ValueError
    says what is wrong."""
    device = device_of(backend)
    if device is None:
        raise ValueError(
            f"backend {backend!r} has no GPU archs kernels checks: archs go with a CUDA "
            "(cu<MM><m>, @8.0,9.0) or ROCm (rocm<M><m>, @gfx942) target"
        )
    rocm: set[str] = set()
    cuda: set[tuple[int, int]] = set()
    for a in archs:
        a = a.strip()
        if device == "rocm":
            a = a.split(":", 1)[0]  # as kernels strips the device's feature flags: gfx90a:sramecc+:xnack-
            if not _ROCM_ARCH.fullmatch(a):
                raise ValueError(f"bad ROCm arch {a!r}: expected a gfx name like gfx90a or gfx942")
            rocm.add(a)
        else:
            m = _CUDA_ARCH.fullmatch(a)
            if not m:
                raise ValueError(
                    f"bad CUDA arch {a!r}: expected a device's compute capability like 8.0 or 9.0 "
                    "(a/f/+PTX describe builds, not devices)"
                )
            cuda.add((int(m[1]), int(m[2])))
    if not (rocm or cuda):
        raise ValueError("no archs after '@': name at least one, e.g. @8.0,9.0")
    if device == "rocm":
        return tuple(sorted(rocm))
    return tuple(f"{major}.{minor}" for major, minor in sorted(cuda))
