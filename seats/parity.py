"""Parity at attach: the kernel against the original module on a probe input, in the module's dtype.

The probe is random (a fixed seed, on the module's device, in its dtype) and shaped like a real call
of the kind. The measure is the relative L2 error ``|y_kernel - y_module| / |y_module|``, computed in
float64; the bound depends on the dtype the site computes in (a catalog ``tolerance`` overrides it).
A kernel that drops the bias, ignores a weight or returns another dtype or shape is refused here,
before it replaces anything.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .calls import Call, takes_residual
from .errors import SiteRefused

# Rounding of one op in the dtype, with headroom for a different summation order; a wrong kernel
# misses by orders of magnitude more (a dropped bias or centred mean is ~1e-1).
DEFAULT_TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2}
PROBE_ROWS = 4


@dataclass(frozen=True)
class Parity:
    error: float
    bound: float


def probe_args(
    kind: str, module: torch.nn.Module, width: int | None, dtype: torch.dtype, device: torch.device, band: int | None
) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator(device=device).manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32).to(dtype)

    if kind != "moe_experts":
        return (randn(2, PROBE_ROWS // 2, width or 64),)
    # An expert bank: tokens within the band (the rows the kernel will serve), top-k routing.
    bank = getattr(module, "gate_up_proj", None)
    bank = bank if isinstance(bank, torch.Tensor) and bank.dim() == 3 else None  # a 3-d expert bank, or None
    experts = getattr(module, "num_experts", None) or (bank.shape[0] if bank is not None else None)
    width = width or (bank.shape[-1] if bank is not None else None)
    if not isinstance(experts, int) or not width:
        raise SiteRefused(
            f"parity: no probe for {type(module).__name__} (it has no num_experts/hidden_dim); "
            "set parity = false for this seat to bind it unchecked"
        )
    k = min(2, experts)
    rows = min(PROBE_ROWS, band or PROBE_ROWS)
    index = torch.stack([torch.randperm(experts, generator=gen, device=device)[:k] for _ in range(rows)])
    weights = torch.softmax(randn(rows, k).float(), dim=-1).to(dtype)
    return randn(rows, int(width)), index, weights


def probe_calls(
    kind: str, module: torch.nn.Module, width: int | None, dtype: torch.dtype, device: torch.device, band: int | None
) -> list[tuple[torch.Tensor, ...]]:
    """Every form of call the site will see: a fused-add norm is probed without and with a residual."""
    args = probe_args(kind, module, width, dtype, device, band)
    if kind != "norm" or not takes_residual(module):
        return [args]
    gen = torch.Generator(device=device).manual_seed(1)
    residual = torch.randn(args[0].shape, generator=gen, device=device, dtype=torch.float32).to(dtype)
    return [args, (args[0], residual)]


def _kind(out: object) -> str:
    return f"a tuple of {len(out)}" if isinstance(out, tuple) else type(out).__name__


def check_parity(
    call: Call, module: torch.nn.Module, args: tuple[torch.Tensor, ...], dtype: torch.dtype, tolerance: float | None
) -> Parity:
    bound = tolerance or DEFAULT_TOLERANCE.get(dtype, 1e-4)
    with torch.no_grad():
        try:
            want = module(*args)
        except Exception as e:  # our probe does not fit this module: say so rather than guess
            raise SiteRefused(
                f"parity: the original {type(module).__name__} rejected the probe "
                f"({type(e).__name__}: {e}); set parity = false to bind it unchecked"
            ) from None
        try:
            got = call(module, *args)
        except Exception as e:  # the kernel failed on a well-formed input: a refusal, with its words
            raise SiteRefused(f"parity: the kernel raised {type(e).__name__}: {e}") from None
    # A fused-add norm returns (normed, sum): every output must agree, the worst one counts.
    wants, gots = (want, got) if isinstance(want, tuple) else ((want,), (got,))
    if not isinstance(gots, tuple) or len(gots) != len(wants):
        raise SiteRefused(f"parity: the kernel returned {_kind(got)}, the module {_kind(want)}")
    error = 0.0
    for g, w in zip(gots, wants, strict=False):
        if not isinstance(g, torch.Tensor):
            raise SiteRefused(f"parity: the kernel returned {type(g).__name__}, not a tensor")
        if g.shape != w.shape or g.dtype != w.dtype:
            raise SiteRefused(
                f"parity: the kernel returned {tuple(g.shape)} {g.dtype}, the module {tuple(w.shape)} {w.dtype}"
            )
        diff = (g.double() - w.double()).norm()
        error = max(error, float(diff / w.double().norm().clamp_min(1e-30)))
    if not error <= bound:  # also catches NaN
        name = str(dtype).removeprefix("torch.")
        raise SiteRefused(f"parity: relative error {error:.3g} > {bound:.3g} ({name})")
    return Parity(error, bound)
