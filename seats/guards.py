"""Per-call guards: may this call take the kernel? Tensor metadata only, so no host-device sync.

Every test reads what the tensor already carries on the host (dtype, device, shape): no ``.item()``,
no reduction, no branch on values. Under ``torch.compile`` these become Dynamo's own guards on the
traced graph (dtype, device and shape are what it guards anyway).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeGuard, cast

import torch

from frt.manifests import Guards

from .errors import SiteRefused


@dataclass(frozen=True)
class Guard:
    dtypes: tuple[torch.dtype, ...]
    devices: tuple[str, ...]
    width: int | None  # the input's last dimension, when the kind fixes it
    max_rows: int | None

    def __post_init__(self) -> None:
        admits, check = _specialised(self)
        object.__setattr__(self, "admits", admits)
        object.__setattr__(self, "check", check)

    def admits(self, x: object) -> TypeGuard[torch.Tensor]:  # replaced per instance by _specialised; kept for the type
        raise NotImplementedError

    def check(self, x: object) -> bool:  # the same test, for a caller that catches its exceptions
        raise NotImplementedError

    def __reduce__(self) -> tuple[type[Guard], tuple[object, ...]]:
        # The specialised functions are rebuilt, not pickled.
        return (Guard, (self.dtypes, self.devices, self.width, self.max_rows))

    def describe(self) -> str:
        parts = [",".join(str(d).removeprefix("torch.") for d in self.dtypes), ",".join(self.devices)]
        if self.width is not None:
            parts.append(f"width {self.width}")
        if self.max_rows is not None:
            parts.append(f"rows <= {self.max_rows}")
        return " ".join(parts)


def _specialised(g: Guard) -> tuple[Callable[[object], TypeGuard[torch.Tensor]], Callable[[object], bool]]:
    """Two expressions with only the tests this guard needs, built once per seat: ``admits`` (safe on
    any object) and ``check`` (the same verdict on tensors; raises on what is not one).

    A seat's guard runs on every eager call of a site that may take ~20 us in all (a Triton launch),
    so its cost is the seat's overhead: a generic method that branches on which fields are set cost
    ~0.8 us on CPython 3.11; each tensor attribute read here costs ~0.1-0.4 us (``x.shape`` builds a
    torch.Size). ``check`` drops the two tests that only keep a non-tensor or a 0-d tensor from
    raising (``isinstance``, ``ndim``): the seat's hot path catches the AttributeError/IndexError
    instead, which costs nothing when nothing is raised. ``x.is_cuda``/``x.is_cpu`` are plain flags
    where ``x.device`` builds an object. Dynamo traces ``admits`` like any function.
    """
    tests = ["x.dtype is DTYPE" if len(g.dtypes) == 1 else "x.dtype in DTYPES"]
    if g.devices in (("cpu",), ("cuda",)):
        tests.append(f"x.is_{g.devices[0]}")
    else:
        tests.append("x.device.type in DEVICES")
    shape = []
    if g.width is not None:
        shape.append("x.shape[-1] == WIDTH")
    if g.max_rows is not None:
        shape.append("x.numel() <= MAX_ROWS * max(1, x.shape[-1])")
    scope = {
        "Tensor": torch.Tensor,
        "DTYPE": g.dtypes[0] if g.dtypes else None,
        "DTYPES": g.dtypes,
        "DEVICES": g.devices,
        "WIDTH": g.width,
        "MAX_ROWS": g.max_rows,
    }
    safe = ["isinstance(x, Tensor)", *tests, *(["x.ndim > 0"] if shape else []), *shape]
    name = f"<frt.seats guard {g.describe()}>"
    admits: Callable[[object], TypeGuard[torch.Tensor]]  # safe's first test: isinstance(x, Tensor)
    check: Callable[[object], bool]
    admits, check = (eval(compile(f"lambda x: {' and '.join(t)}", name, "eval"), scope) for t in (safe, tests + shape))
    return admits, check


class _TensorGuards(Protocol):
    """torch._C._dynamo.guards.TensorGuards as its C++ constructor takes it: the tensors, then per tensor a
    list of sizes and one of strides, None where dynamic. torch's stub (_C/_dynamo/guards.pyi) lacks the
    positional tensors and types dynamic_dims_* as one flat list; `_probe` checks the real one."""

    def __call__(
        self,
        *tensors: torch.Tensor,
        dynamic_dims_sizes: list[list[int | None]],
        dynamic_dims_strides: list[list[int | None]],
    ) -> _Check: ...


class _Check(Protocol):
    def check(self, x: object, /) -> bool: ...


_TENSOR_GUARDS: list[_TensorGuards | None] = []  # [TensorGuards class or None], decided once per process by _probe


def tensor_match(g: Guard, example: torch.Tensor) -> Callable[[object], bool] | None:
    """A one-call C check that admits only what ``g`` admits, specialised on an admitted example:
    torch's own Dynamo tensor guard (``torch._C._dynamo.guards.TensorGuards``), given every size but
    the guarded width as dynamic and no strides. It checks the example's Python type, dtype, device
    (index too), number of dims, that width, requires_grad and dispatch keys, all read in C++: ~250 ns
    where the three tensor attributes read from Python cost ~450 ns on a 2-vCPU VM (each
    ``x.attr`` is a torch getter; ``x.shape`` builds a torch.Size). Strictly narrower than ``g``: a
    tensor it passes differs from the example only in sizes that ``g`` does not test and in strides,
    which it does not test either. What it misses goes to ``g.admits`` (the seat's `_admit`), so a
    miss costs time, never a wrong verdict. None where ``g`` bounds rows (a numel test it cannot
    express) or where this torch has no such class or it does not behave as probed."""
    factory = None if g.max_rows is not None else _probe()
    if factory is None:
        return None
    sizes: list[int | None] = [None] * example.dim()
    if g.width is not None:
        sizes[-1] = g.width
    try:
        return factory(example, dynamic_dims_sizes=[sizes], dynamic_dims_strides=[[None] * len(sizes)]).check
    except Exception:  # a torch whose class takes other arguments: the Python guard alone
        return None


def _probe() -> _TensorGuards | None:
    """A TensorGuards that keeps the verdicts `tensor_match` relies on, or None. Checked once, on CPU
    tensors: an equal tensor of other leading sizes passes; other width, dtype, dims, a non-tensor fail."""
    if not _TENSOR_GUARDS:
        found: _TensorGuards | None = None
        try:
            from torch._C._dynamo.guards import TensorGuards

            # Its stub is not the constructor (see _TensorGuards); the checks below probe the real one.
            factory = cast(_TensorGuards, TensorGuards)
            ex = torch.zeros(2, 1, 8)
            check = factory(ex, dynamic_dims_sizes=[[None, None, 8]], dynamic_dims_strides=[[None] * 3]).check
            if (
                check(torch.zeros(5, 3, 8)) is True
                and not check(torch.zeros(2, 1, 4))
                and not check(ex.double())
                and not check(torch.zeros(2, 8))
                and not check("x")
            ):
                found = factory
        except Exception:  # absent or changed in this torch: every seat keeps its Python check
            found = None
        _TENSOR_GUARDS.append(found)
    return _TENSOR_GUARDS[0]


def module_width(kind: str, module: torch.nn.Module) -> int | None:
    """The input width a module of this kind takes, when its weights say so."""
    weight = getattr(module, "weight", None)
    if kind in ("linear", "lm_head") and isinstance(weight, torch.Tensor) and weight.dim() == 2:
        return int(weight.shape[1])
    if kind == "norm" and isinstance(weight, torch.Tensor) and weight.dim() >= 1:
        return int(weight.shape[-1])
    if kind == "moe_experts":
        width = getattr(module, "hidden_dim", None) or getattr(module, "hidden_size", None)
        return int(width) if isinstance(width, int) else None
    if kind == "mlp":
        width = getattr(module, "hidden_size", None)
        gate = getattr(getattr(module, "gate_proj", None), "weight", None)
        if not isinstance(width, int) and isinstance(gate, torch.Tensor) and gate.dim() == 2:
            width = gate.shape[1]
        return int(width) if isinstance(width, int) else None
    return None  # activation: elementwise, any width


def build_guard(spec: Guards, kind: str, module: torch.nn.Module, dtype: torch.dtype, device: torch.device) -> Guard:
    """The guard of one site. A catalog guard that the module itself fails is a refusal at attach:
    the seat would fall back on every call, so it is not installed."""
    dtype_name = str(dtype).removeprefix("torch.")
    if spec.dtypes and dtype_name not in spec.dtypes:
        raise SiteRefused(f"guard mismatch: the module is {dtype_name}, the seat admits {', '.join(spec.dtypes)}")
    if spec.devices and device.type not in spec.devices:
        raise SiteRefused(f"guard mismatch: the module is on {device.type}, the seat admits {', '.join(spec.devices)}")
    width = module_width(kind, module)
    if spec.width is not None and width is not None and spec.width != width:
        raise SiteRefused(f"guard mismatch: the module takes width {width}, the seat admits width {spec.width}")
    dtypes = tuple(getattr(torch, d) for d in spec.dtypes) if spec.dtypes else (dtype,)
    return Guard(
        dtypes=dtypes, devices=spec.devices or (device.type,), width=spec.width or width, max_rows=spec.max_rows
    )
