"""Attach-time checks of a site: is the module what its kind says, and can the variant run where it lives?"""

from __future__ import annotations

import torch

from .errors import SiteRefused
from .source import LoadedKernel

# metadata.json backend.type a variant may declare, by the torch device type it can serve.
_BACKENDS_FOR = {"cpu": ("cpu",), "cuda": ("cuda", "rocm"), "xpu": ("xpu",), "mps": ("metal",), "npu": ("cann",)}


def module_problem(kind: str, module: torch.nn.Module) -> str | None:
    weight = getattr(module, "weight", None)
    if kind in ("linear", "lm_head") and not (isinstance(weight, torch.Tensor) and weight.dim() == 2):
        return f"a {kind} seat needs a module with a 2-D weight; {type(module).__name__} has none"
    if kind == "norm" and not (isinstance(weight, torch.Tensor) and weight.dim() == 1):
        return f"a norm seat needs a module with a 1-D weight; {type(module).__name__} has none"
    if kind == "norm" and getattr(module, "variance_size_override", None) is not None:
        # vLLM's RMSNorm may take its statistics over the first N channels only; f(x, weight, eps) cannot.
        return f"{type(module).__name__} normalises over variance_size_override channels, not the whole row"
    return None


def home_of(module: torch.nn.Module, model: torch.nn.Module) -> tuple[torch.dtype, torch.device]:
    """The dtype and device a site computes in: its own first floating tensor, else the model's
    (an activation module owns no weights)."""
    for owner in (module, model):
        for t in (*owner.parameters(), *owner.buffers()):
            if t.is_floating_point():
                return t.dtype, t.device
    return torch.get_default_dtype(), torch.device("cpu")


def arch_problem(archs: tuple[str, ...] | list[str], capability: tuple[int, int]) -> str | None:
    """Why a CUDA build declaring ``archs`` cannot run on a device of ``capability``, or None.
    The rule is the `kernels` library's own (plain cubin: same major, minor >= declared; ``+PTX``:
    any newer device; ``a``: exact; ``f``: same family), so a seat refuses what get_kernel would."""
    from kernels.archs import _supports_cuda_capability

    if not archs or _supports_cuda_capability(list(archs), capability):
        return None
    return (
        f"CUDA capability {capability[0]}.{capability[1]} of the module's device is not among the "
        f"variant's declared archs ({', '.join(archs)})"
    )


def rocm_arch_problem(archs: tuple[str, ...] | list[str], gcn_arch_name: str) -> str | None:
    """Why a ROCm build declaring ``archs`` cannot run on a device whose ``gcnArchName`` is given, or
    None. As in `kernels`: feature flags are stripped (``gfx90a:sramecc+:xnack-`` is ``gfx90a``) and the
    arch must be listed exactly: ROCm code objects do not run on a neighbouring gfx."""
    arch = gcn_arch_name.split(":")[0]
    if not archs or arch in archs:
        return None
    return f"ROCm arch {arch} of the module's device is not among the variant's declared archs ({', '.join(archs)})"


def device_problem(kernel: LoadedKernel, device: torch.device) -> str | None:
    """A variant built for another backend than the module's device is refused; torch-universal serves
    every device. On a GPU, metadata.json backend.archs must cover the module's own device (not the
    current one: a model may sit on cuda:1 while cuda:0 is current); a CUDA build does not run on a
    ROCm device (torch calls both "cuda") nor a ROCm build on NVIDIA. On CPU there is nothing to check."""
    variant, backend = kernel.resolution.variant, kernel.backend_type
    if variant != "torch-universal" and backend not in _BACKENDS_FOR.get(device.type, (device.type,)):
        return f"variant {variant} is built for {backend}, the module is on {device.type}"
    if device.type == "cuda" and backend in ("cuda", "rocm"):
        on_rocm = torch.version.hip is not None
        if (backend == "rocm") != on_rocm:
            return f"variant {variant} is built for {backend}, the module's device is {'ROCm' if on_rocm else 'CUDA'}"
        if on_rocm:
            return rocm_arch_problem(kernel.archs, torch.cuda.get_device_properties(device).gcnArchName)
        return arch_problem(kernel.archs, torch.cuda.get_device_capability(device))
    return None


def refuse_if(problem: str | None) -> None:
    if problem is not None:
        raise SiteRefused(problem)
