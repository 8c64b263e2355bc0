"""Which build variants a target accepts, and in what order — by the `kernels` library's rules.

This is the only module that touches `kernels.variants` internals
(`parse_variant`, `_resolve_variant_for_system`); pyproject pins the `kernels`
range it was written against. Everything else sees `VariantDecision`s.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from packaging.version import Version

from kernels.backends import parse_backend
from kernels.variants import (
    ArchVariant,
    Torch,
    TorchStableAbi,
    TvmFfi,
    VariantAccepted,
    _resolve_variant_for_system,
    parse_variant,
)

from .targets import Target

_MACOS_FOR_TARGETS = Version("26.0")


@dataclass(frozen=True)
class VariantDecision:
    name: str
    accepted: bool
    reason: str = ""  # the library's own wording when rejected


@dataclass(frozen=True)
class VariantFields:
    """The parts of a variant directory name, for the ledger and the matrix."""

    framework: str  # torch | torch-stable-abi | tvm-ffi | noarch
    framework_version: str | None
    cxx11: bool | None
    backend: str
    cpu: str | None
    os: str | None


def parse_fields(name: str) -> VariantFields | None:
    """Split a variant name into fields, or None when `kernels` cannot parse it."""
    try:
        v = parse_variant(name)
    except ValueError:
        return None
    if not isinstance(v, ArchVariant):
        return VariantFields("noarch", None, None, v.arch.backend_name, None, None)
    fw = v.framework
    kind = {Torch: "torch", TorchStableAbi: "torch-stable-abi", TvmFfi: "tvm-ffi"}[type(fw)]
    cxx11 = fw.cxx11_abi if isinstance(fw, Torch) else None
    version = f"{fw.version.major}.{fw.version.minor}"
    return VariantFields(kind, version, cxx11, v.arch.backend.variant_str, v.arch.platform, v.arch.os)


def decide(target: Target, names: list[str] | tuple[str, ...]) -> tuple[VariantDecision, ...]:
    """Every variant name judged for `target`: accepted first, in the library's preference order.

    Names the library cannot parse are rejected (it skips them too), last.
    """
    return _decide(target, tuple(sorted(names)))


# Commits share their variant sets, so a ledger resolve mostly hits this cache.
@lru_cache(maxsize=8192)
def _decide(target: Target, names: tuple[str, ...]) -> tuple[VariantDecision, ...]:
    parsed, unparseable = {}, []
    for name in names:
        try:
            parsed[parse_variant(name)] = name
        except ValueError:
            unparseable.append(name)
    _, trace = _resolve_variant_for_system(
        variants=list(parsed),
        selected_backend=parse_backend(target.backend),
        cpu=target.cpu,
        os=target.os,
        torch_version=target.torch,
        torch_cxx11_abi=target.cxx11_abi,
        tvm_ffi_version=None,
        # A darwin target names no macOS release; assume one new enough for Metal builds.
        macos_version=_MACOS_FOR_TARGETS if target.os == "darwin" else None,
    )
    out = [
        VariantDecision(parsed[d.variant], isinstance(d, VariantAccepted), getattr(d, "reason", ""))
        for d in trace
    ]
    out += [VariantDecision(n, False, "not a build variant name kernels can parse") for n in unparseable]
    return tuple(out)


def accepted(target: Target, names: list[str] | tuple[str, ...]) -> list[str]:
    """The variant names `target` accepts, best first."""
    return [d.name for d in decide(target, names) if d.accepted]
