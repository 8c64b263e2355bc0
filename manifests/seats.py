"""The seat catalog: which module positions of a model get which kernel, under which guards.

A catalog is a list of seats. Each seat says where (``match``: module path suffix patterns such
as ``mlp.down_proj`` or ``layers.*.self_attn.o_proj``; ``match_class``: module class names such
as ``Qwen3RMSNorm``), what it is (``kind``), which kernel serves it (``kernel``: a Hub repo at a
version or revision, and the ``layer`` class or ``function`` inside the kernel module), when a
call may take the kernel (``guards``), and whether attach compares the kernel with the original
module on a probe input first (``parity``, ``tolerance``).

Two doors build the same frozen dataclasses: ``load_seat_catalog(path)`` for TOML (errors are
``file:line: field: what``, like the staging manifest) and the constructors themselves, which
validate in ``__post_init__`` and raise ``SeatSpecError`` (a ``ValueError``) naming the field.
Stdlib only, like the rest of ``frt.manifests``: torch enters at ``frt.seats``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from .fields import MAX_INT, repo_id_problem, short
from .load import _parse_toml, _read
from .source import Source, ValuePath
from .toml_lines import line_of, scan

#: linear: a dense projection (``y = x W^T + b``); norm: RMSNorm-like (weight, eps);
#: activation: elementwise ``y = f(x)``; moe_experts: a routed expert bank
#: ``f(hidden, top_k_index, top_k_weights)`` with a row band; lm_head: a projection bound as row slabs;
#: mlp: a whole gated MLP block (``down(act(gate(x)) * up(x))``), so a fused SiLU-and-mul can serve it.
KINDS = ("linear", "norm", "activation", "moe_experts", "lm_head", "mlp")
DTYPES = ("float32", "float16", "bfloat16", "float64")
DEVICE_TYPES = ("cpu", "cuda", "xpu", "mps", "npu")
DEFAULT_BAND = 16  # FRT_MOE_BAND_T when unset: flash-rt's decode band

# A path pattern is dotted components, each an identifier, an index, or '*' (any one component).
_COMPONENT = re.compile(r"\*|[A-Za-z_][A-Za-z0-9_]*|\d+")
_CLASS = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SEAT_KEYS = ("name", "match", "match_class", "kind", "kernel", "guards", "parity", "tolerance", "band", "slab_rows")
_KERNEL_KEYS = ("repo", "version", "revision", "layer", "function")
_GUARD_KEYS = ("dtypes", "devices", "width", "max_rows")
_LIST_KEYS = ("match", "match_class", "dtypes", "devices")

_T = TypeVar("_T")


class SeatSpecError(ValueError):
    """A bad field in a seat spec. ``field`` is its dotted path inside the object (``kernel.version``)."""

    def __init__(self, field: str, what: str):
        self.field, self.what = field, what
        super().__init__(f"{field}: {what}")


def _positive_int(value: object, name: str, *, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= MAX_INT:
        raise SeatSpecError(name, f"must be a positive integer up to {MAX_INT}, got {short(value)}")


def _names(value: object, name: str, allowed: tuple[str, ...]) -> None:
    if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
        raise SeatSpecError(name, f"must be a list of strings, got {value!r}")
    for v in value:
        if v not in allowed:
            raise SeatSpecError(name, f"unknown {v!r}; expected one of {', '.join(allowed)}")


@dataclass(frozen=True)
class KernelRef:
    """A kernel as the resolver knows it (repo at a version or revision) and the name inside it."""

    repo: str
    version: int | None = None
    revision: str | None = None
    layer: str | None = None  # a kernels-style layer class in ``module.layers`` (forward only)
    function: str | None = None  # a function of the kernel module, called by the kind's convention
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        problem = repo_id_problem(self.repo)
        if problem:
            raise SeatSpecError("repo", problem)
        if (self.version is None) == (self.revision is None):
            raise SeatSpecError("version", 'needs exactly one of version = N or revision = "..."')
        if self.version is not None and (
            not isinstance(self.version, int) or isinstance(self.version, bool) or not 0 <= self.version <= MAX_INT
        ):
            raise SeatSpecError(
                "version", f"must be a non-negative integer up to {MAX_INT} (branch vN), got {short(self.version)}"
            )
        if self.revision is not None and (
            not isinstance(self.revision, str) or not self.revision.strip() or any(c.isspace() for c in self.revision)
        ):
            raise SeatSpecError("revision", f"must be a commit, branch or tag name, got {self.revision!r}")
        if (self.layer is None) == (self.function is None):
            raise SeatSpecError("layer", 'needs exactly one of layer = "<class in layers>" or function = "<name>"')
        name = self.layer if self.layer is not None else self.function
        if not isinstance(name, str) or not _CLASS.fullmatch(name):
            raise SeatSpecError(
                "layer" if self.layer is not None else "function", f"must be a Python identifier, got {name!r}"
            )

    @property
    def entry(self) -> str:
        return f"layers.{self.layer}" if self.layer is not None else str(self.function)

    @property
    def label(self) -> str:
        at = f"v{self.version}" if self.version is not None else f"revision {self.revision}"
        return f"{self.repo} {at} {self.entry}"


@dataclass(frozen=True)
class Guards:
    """What a call must look like to take the kernel; any miss runs the original forward (counted).

    Empty ``dtypes``/``devices`` mean "what the module had at attach" (the dtype and device the
    parity probe ran in); ``width`` None means the module's own input width.
    """

    dtypes: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    width: int | None = None  # the input's last dimension
    max_rows: int | None = None  # rows = numel / width; above it the original serves

    def __post_init__(self) -> None:
        _names(self.dtypes, "dtypes", DTYPES)
        _names(self.devices, "devices", DEVICE_TYPES)
        _positive_int(self.width, "width")
        _positive_int(self.max_rows, "max_rows")


@dataclass(frozen=True)
class SeatSpec:
    kind: str
    kernel: KernelRef
    match: tuple[str, ...] = ()  # module path suffix patterns, matched on whole components
    match_class: tuple[str, ...] = ()  # module class names (type(module).__name__)
    name: str | None = None
    guards: Guards = Guards()
    parity: bool = True
    tolerance: float | None = None  # relative L2 error bound; None: the per-dtype default
    band: int | None = None  # moe_experts: rows served by the kernel; None: $FRT_MOE_BAND_T or 16
    slab_rows: int | None = None  # lm_head: rows per slab; None: ceil(rows/4) floored to 64
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise SeatSpecError("kind", f"unknown {self.kind!r}; expected one of {', '.join(KINDS)}")
        if not isinstance(self.kernel, KernelRef):
            raise SeatSpecError("kernel", f"must be a KernelRef, got {type(self.kernel).__name__}")
        if not isinstance(self.guards, Guards):
            raise SeatSpecError("guards", f"must be a Guards, got {type(self.guards).__name__}")
        for name, values, pattern in (("match", self.match, None), ("match_class", self.match_class, _CLASS)):
            if not isinstance(values, tuple) or not all(isinstance(v, str) for v in values):
                raise SeatSpecError(name, f"must be a list of strings, got {values!r}")
            for v in values:
                ok = pattern.fullmatch(v) if pattern else all(_COMPONENT.fullmatch(c) for c in v.split("."))
                if not ok:
                    hint = "a class name" if pattern else "dotted names, indices or '*', like mlp.down_proj"
                    raise SeatSpecError(name, f"{v!r} is not {hint}")
        if self.name is not None and (not isinstance(self.name, str) or not self.name.strip()):
            raise SeatSpecError("name", f"must be a non-empty string, got {self.name!r}")
        if not self.match and not self.match_class:
            raise SeatSpecError("match", "needs at least one path pattern (match) or class name (match_class)")
        if not isinstance(self.parity, bool):
            raise SeatSpecError("parity", f"must be true or false, got {self.parity!r}")
        if self.tolerance is not None and (
            not isinstance(self.tolerance, (int, float))
            or isinstance(self.tolerance, bool)
            or not 0 < self.tolerance < 1
            or math.isnan(self.tolerance)
        ):
            raise SeatSpecError("tolerance", f"must be a number in (0, 1), got {self.tolerance!r}")
        _positive_int(self.band, "band")
        _positive_int(self.slab_rows, "slab_rows")
        if self.band is not None and self.kind != "moe_experts":
            raise SeatSpecError("band", f"only a moe_experts seat has a row band, not {self.kind}")
        if self.slab_rows is not None and self.kind != "lm_head":
            raise SeatSpecError("slab_rows", f"only an lm_head seat is bound as row slabs, not {self.kind}")
        if self.kind == "moe_experts" and self.kernel.layer is None:
            # The bank's weight layout (fused gate/up, transposed or not) is the module's business;
            # a kernels-style layer reads it from self, a bare function would have to guess it.
            raise SeatSpecError(
                "kernel.layer",
                "a moe_experts seat needs a layer (forward(self, "
                "hidden_states, top_k_index, top_k_weights)), not a function",
            )
        if self.kind == "mlp" and self.kernel.layer is None:
            # Which projections the block holds, and how they are fused, is the module's business.
            raise SeatSpecError(
                "kernel.layer",
                "an mlp seat needs a layer (forward(self, x), reading the block's own projections), not a function",
            )
        if self.kind == "lm_head" and self.kernel.function is None:
            # Each slab is a view of the weight's rows; a layer would read the whole module's weight.
            raise SeatSpecError(
                "kernel.function",
                "an lm_head seat calls a function f(x, weight, bias) "
                'once per row slab; give function = "...", not a layer',
            )

    @property
    def label(self) -> str:
        return self.name or (self.match + self.match_class)[0]


@dataclass(frozen=True)
class SeatCatalog:
    seats: tuple[SeatSpec, ...]
    path: Path | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.seats, tuple) or not all(isinstance(s, SeatSpec) for s in self.seats):
            raise SeatSpecError("seats", "must be a tuple of SeatSpec")

    def kernels(self) -> tuple[KernelRef, ...]:
        """The distinct kernels the catalog needs (what a staging manifest must list)."""
        return tuple(dict.fromkeys(s.kernel for s in self.seats))


def load_seat_catalog(path: str | Path) -> SeatCatalog:
    """Parse a seat catalog TOML. Raises ManifestError (``file:line: field: what``)."""
    path = Path(path)
    text = _read(path)
    return parse_seat_catalog(text, path)


def parse_seat_catalog(text: str, path: str | Path = "<seats>") -> SeatCatalog:
    path = Path(path)
    data = _parse_toml(path, text)
    src = Source(path, text, partial(line_of, scan(text)))
    for key in data:
        if key != "seats":
            raise src.error((key,), "unknown top-level key; expected [[seats]] tables")
    raw = data.get("seats")
    if not isinstance(raw, list) or not raw or not all(isinstance(s, dict) for s in raw):
        raise src.error(("seats",), "needs one or more [[seats]] tables", line=src.line(("seats",)))
    return SeatCatalog(tuple(_seat(src, s, ("seats", i)) for i, s in enumerate(raw)), path)


def _seat(src: Source, raw: dict[str, Any], path: ValuePath) -> SeatSpec:
    _known(src, raw, _SEAT_KEYS, path)
    for required in ("kind", "kernel"):
        if required not in raw:
            raise src.error(path, f"missing {required}", missing=required)
    kernel = _sub(src, raw["kernel"], _KERNEL_KEYS, path + ("kernel",), KernelRef)
    guards = _sub(src, raw.get("guards", {}), _GUARD_KEYS, path + ("guards",), Guards)
    kwargs = {k: _value(k, v) for k, v in raw.items() if k not in ("kernel", "guards")}
    return _build(src, path, SeatSpec, kernel=kernel, guards=guards, source=src.at(path), **kwargs)


def _sub(src: Source, raw: object, keys: tuple[str, ...], path: ValuePath, cls: Callable[..., _T]) -> _T:
    if not isinstance(raw, dict):
        raise src.error(path, f"must be a table with {', '.join(keys)}")
    _known(src, raw, keys, path)
    extra = {"source": src.at(path)} if cls is KernelRef else {}
    return _build(src, path, cls, **{k: _value(k, v) for k, v in raw.items()}, **extra)


def _build(src: Source, path: ValuePath, cls: Callable[..., _T], **kwargs: object) -> _T:
    try:
        return cls(**kwargs)
    except SeatSpecError as e:
        raise src.error(path + tuple(e.field.split(".")), e.what) from None


def _known(src: Source, raw: dict[str, Any], keys: tuple[str, ...], path: ValuePath) -> None:
    for key in raw:
        if key not in keys:
            raise src.error(path + (key,), f"unknown key; expected {', '.join(keys)}")


def _value(key: str, value: object) -> object:
    """TOML arrays become tuples (the dataclasses are frozen); a list field also takes one string."""
    if key in _LIST_KEYS and isinstance(value, str):
        return (value,)
    return tuple(value) if isinstance(value, list) else value
