"""Which build variants a target accepts, and in what order — by the `kernels` library's rules.

This is the only module that touches `kernels.variants` internals
(`parse_variant`, `_resolve_variant_for_system`); pyproject pins the `kernels`
range it was written against. Everything else sees `VariantDecision`s.

A target that names GPU archs also rejects, of the variants its name accepts, each build whose
metadata.json archs miss one of them (kernels' own arch rule, archs.py): kernels would pick it by name
and then refuse to load it there. The rest keep kernels' order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

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

from .archs import NOARCH, Declared, reason, uncovered
from .targets import Target


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


def decide(
    target: Target, names: list[str] | tuple[str, ...], declared: Mapping[str, Declared] | None = None
) -> tuple[VariantDecision, ...]:
    """Every variant name judged for `target`: accepted first, in the library's preference order.

    Names the library cannot parse are rejected (it skips them too), last. For a target with archs,
    `declared` (each variant's metadata backend; a variant missing from it declares no archs) rejects
    the builds kernels would refuse to load on one of them, right after the accepted ones.
    """
    by_name = _decide(target.by_name, tuple(sorted(names)))
    if not target.archs:
        return by_name
    if declared is None:  # judging by name alone would hand out the very builds that raise at load
        raise TypeError(f"deciding for {target} needs each variant's declared archs")
    kept, lost = [], []
    for d in by_name:
        missing = uncovered(target.device, target.archs, declared.get(d.name, NOARCH)) if d.accepted else ()
        if missing:
            lost.append(VariantDecision(d.name, False, reason(target.device, missing, declared[d.name])))
        else:
            kept.append(d)
    accepted_now = [d for d in kept if d.accepted]
    return tuple(accepted_now + lost + [d for d in kept if not d.accepted])


def by_name_best(target: Target, names: list[str] | tuple[str, ...]) -> str | None:
    """The variant kernels itself picks by name for this target (archs unseen: it checks them after)."""
    return next((d.name for d in _decide(target.by_name, tuple(sorted(names))) if d.accepted), None)


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
        tvm_ffi_version=target.tvm_ffi,
        macos_version=target.macos,
    )
    out = [VariantDecision(parsed[d.variant], isinstance(d, VariantAccepted), getattr(d, "reason", "")) for d in trace]
    out += [VariantDecision(n, False, "not a build variant name kernels can parse") for n in unparseable]
    return tuple(out)


def accepted(
    target: Target, names: list[str] | tuple[str, ...], declared: Mapping[str, Declared] | None = None
) -> list[str]:
    """The variant names `target` accepts, best first."""
    return [d.name for d in decide(target, names, declared) if d.accepted]
