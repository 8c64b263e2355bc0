"""Which build variants a target accepts, and in what order — by the `kernels` library's rules.

This is the only module that touches `kernels.variants` internals
(`parse_variant`, `_resolve_variant_for_system`); pyproject pins the `kernels`
range it was written against. Everything else sees `VariantDecision`s. What kernels
answers is remembered per installation (decisions_memo.py): a reading command whose
answers are kept imports no kernels.

A target that names GPU archs also rejects, of the variants its name accepts, each build whose
metadata.json archs miss one of them (kernels' own arch rule, archs.py): kernels would pick it by name
and then refuse to load it there. The rest keep kernels' order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from packaging.version import Version

from .archs import NOARCH, Declared, reason, uncovered
from .decisions_memo import memo
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
    fields = memo().answer("fields", [name], fields_by_kernels)
    return VariantFields(*fields) if fields else None


def fields_by_kernels(name: str) -> list[Any]:
    """parse_fields' answer from kernels itself: VariantFields' values, or [] where it cannot parse."""
    from kernels.variants import ArchVariant, Torch, TorchStableAbi, TvmFfi, parse_variant

    try:
        v = parse_variant(name)
    except ValueError:
        return []
    if not isinstance(v, ArchVariant):
        return ["noarch", None, None, v.arch.backend_name, None, None]
    fw = v.framework
    kind = {Torch: "torch", TorchStableAbi: "torch-stable-abi", TvmFfi: "tvm-ffi"}[type(fw)]
    cxx11 = fw.cxx11_abi if isinstance(fw, Torch) else None
    version = f"{fw.version.major}.{fw.version.minor}"
    return [kind, version, cxx11, v.arch.backend.variant_str, v.arch.platform, v.arch.os]


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
    # Exactly what kernels is passed of the target (a Version as its text), and the names.
    t = target
    inputs = [t.backend, t.cpu, t.os, _text(t.torch), t.cxx11_abi, _text(t.tvm_ffi), _text(t.macos), list(names)]
    return tuple(VariantDecision(*d) for d in memo().answer("decide", inputs, decide_by_kernels))


def _text(version: Version | None) -> str | None:
    return None if version is None else str(version)


def decide_by_kernels(
    backend: str,
    cpu: str,
    os: str,
    torch: str | None,
    cxx11_abi: bool | None,
    tvm_ffi: str | None,
    macos: str | None,
    names: list[str],
) -> list[Any]:
    """_decide's answer from kernels itself, for a system given field by field: [name, accepted, reason]
    per variant, accepted first in kernels' order, then the names it cannot parse."""
    from kernels.backends import parse_backend
    from kernels.variants import VariantAccepted, _resolve_variant_for_system, parse_variant

    parsed, unparseable = {}, []
    for name in names:
        try:
            parsed[parse_variant(name)] = name
        except ValueError:
            unparseable.append(name)
    _, trace = _resolve_variant_for_system(
        variants=list(parsed),
        selected_backend=parse_backend(backend),
        cpu=cpu,
        os=os,
        torch_version=Version(torch) if torch is not None else None,
        torch_cxx11_abi=cxx11_abi,
        tvm_ffi_version=Version(tvm_ffi) if tvm_ffi is not None else None,
        macos_version=Version(macos) if macos is not None else None,
    )
    out = [[parsed[d.variant], isinstance(d, VariantAccepted), getattr(d, "reason", "")] for d in trace]
    return out + [[n, False, "not a build variant name kernels can parse"] for n in unparseable]


def accepted(
    target: Target, names: list[str] | tuple[str, ...], declared: Mapping[str, Declared] | None = None
) -> list[str]:
    """The variant names `target` accepts, best first."""
    return [d.name for d in decide(target, names, declared) if d.accepted]
