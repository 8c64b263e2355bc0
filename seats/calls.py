"""How a seat calls its kernel: one calling convention per seat kind, checked at attach.

A call is ``call(original_module, *args, **kwargs) -> Tensor``, the forward arguments unchanged.

- ``layer``: a kernels-style layer class (``module.layers.<Name>``: an ``nn.Module`` subclass with no
  ``__init__``, forward only). Its forward is called with the *original module* as ``self``, exactly
  as ``kernels.kernelize`` binds it, so it reads the module's own weights, bias and epsilon.
- ``function``: ``linear``/``lm_head`` ``f(x, weight, bias)`` (bias passed, possibly None, never
  dropped); ``norm`` ``f(x, weight, eps)``; ``activation`` ``f(x)``. An ``lm_head`` calls it once per
  row slab of the weight (views, no copies) and concatenates the logits.
- A norm that fuses the residual add (vLLM's and SGLang's RMSNorm: ``norm(x, residual)`` returns
  ``(norm(x + residual), x + residual)``, ``norm(x)`` a tensor) keeps that contract: the function is
  given ``x + residual``, and the sum is returned beside it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import ModuleType
from typing import Any, cast

import torch

from frt.manifests import SeatSpec

from .errors import SiteRefused

#: A kernel function, as every convention here calls it: tensors in, a tensor out (parity checks it at attach).
KernelFn = Callable[..., torch.Tensor]
#: A seat's call returns what the module's forward does: a tensor, or a fused-add norm's (normed, sum).
Call = Callable[..., torch.Tensor | tuple[torch.Tensor, torch.Tensor]]
EPS_NAMES = ("variance_epsilon", "eps", "epsilon")


def kernel_call(
    spec: SeatSpec, module: torch.nn.Module, kernel: ModuleType, slabs: list[tuple[int, int]] | None = None
) -> Call:
    ref = spec.kernel
    if ref.layer is not None:
        return _layer_forward(ref.layer, module, kernel)
    assert ref.function is not None  # KernelRef holds exactly one of layer and function
    found = getattr(kernel, ref.function, None)
    if not callable(found):
        raise SiteRefused(f"{ref.label}: the kernel has no function {ref.function!r}")
    fn: KernelFn = found
    if spec.kind == "linear":
        return lambda m, x: fn(x, m.weight, getattr(m, "bias", None))
    if spec.kind == "norm":
        eps = next((n for n in EPS_NAMES if isinstance(getattr(module, n, None), float)), None)
        if eps is None:
            raise SiteRefused(f"{type(module).__name__} has no float {'/'.join(EPS_NAMES)} to pass as eps")
        if takes_residual(module):

            def fused_add(
                m: torch.nn.Module, x: torch.Tensor, residual: torch.Tensor | None = None
            ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
                if residual is None:
                    return fn(x, m.weight, getattr(m, eps))
                x = x + residual  # rounded to x's dtype, as the engines' own residual is
                return fn(x, m.weight, getattr(m, eps)), x

            return fused_add
        return lambda m, x: fn(x, m.weight, getattr(m, eps))
    if spec.kind == "activation":
        return lambda m, x: fn(x)
    if spec.kind == "lm_head":
        return _slabbed(fn, slabs or [])
    raise SiteRefused(f"a {spec.kind} seat needs a layer, not a function")  # the catalog already says so


def slab_bounds(rows: int, slab_rows: int | None = None) -> list[tuple[int, int]]:
    """Row slabs of a head weight: ``ceil(rows/4)`` floored to a multiple of 64 (at least 64), so a
    151,936-row vocabulary gives 4 x 37,952 + 128 rows = 5 slabs, as flash-rt's head does."""
    size = slab_rows or max(64, -(-rows // 4) // 64 * 64)
    return [(a, min(a + size, rows)) for a in range(0, rows, size)]


def _slabbed(fn: KernelFn, slabs: list[tuple[int, int]]) -> Call:
    def call(m: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        w, b = cast(torch.Tensor, m.weight), getattr(m, "bias", None)  # an lm_head's weight is a tensor
        return torch.cat([fn(x, w[lo:hi], None if b is None else b[lo:hi]) for lo, hi in slabs], dim=-1)

    return call


def _layer_forward(name: str, module: torch.nn.Module, kernel: ModuleType) -> Call:
    layers = getattr(kernel, "layers", None)
    cls = getattr(layers, name, None)
    if cls is None:
        have = sorted(n for n, v in vars(layers).items() if isinstance(v, type)) if layers is not None else []
        raise SiteRefused(f"the kernel has no layers.{name} (it has: {', '.join(have) or 'no layers'})")
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise SiteRefused(f"layers.{name} is not an nn.Module subclass")
    if "__init__" in vars(cls):
        raise SiteRefused(
            f"layers.{name} defines __init__; a kernels layer is forward-only and reads "
            "the replaced module's attributes"
        )
    mine, theirs = _params(cls.forward), _params(module_forward(module))
    if [p.kind for p in mine] != [p.kind for p in theirs]:
        raise SiteRefused(
            f"layers.{name}.forward({', '.join(p.name for p in mine)}) does not match "
            f"{type(module).__name__}.forward({', '.join(p.name for p in theirs)})"
        )
    return cls.forward


def module_forward(module: torch.nn.Module) -> Callable[..., Any]:
    """The forward that shows a module's real arguments: vLLM's CustomOps dispatch through a generic
    ``forward(*args, **kwargs)`` to ``forward_native`` (or a device twin of the same signature)."""
    cls = type(module)
    return getattr(cls, "forward_native", None) or cls.forward


def takes_residual(module: torch.nn.Module) -> bool:
    """A norm whose second argument is the residual it adds first (the engines' fused-add RMSNorm)."""
    params = _params(module_forward(module))
    return len(params) >= 2 and params[1].name == "residual"


def _params(fn: Callable[..., Any]) -> list[inspect.Parameter]:
    """The parameters after ``self``. ``inspect.signature`` follows ``functools.wraps``, so a forward
    wrapped by a dispatching decorator (transformers' experts) shows its real arguments."""
    return list(inspect.signature(fn).parameters.values())[1:]
