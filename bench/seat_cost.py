"""Where a seat's per-call cost goes, paid beside its kernel's real launch.

    python -m bench.seat_cost [--device cuda] [--quick]

A seat's own cost in a tight loop (a kernel that returns its input: bench.seats' "own cost" line) is
not what a model pays. Beside a real launch (~30 us of Triton's Python on a GPU host, a few torch
ops on CPU) the seat's code and data are no longer in the caches, and the same code costs about
twice as much. So each part is measured where it is paid: a chain of calls over one seat's own
state (seats.hot.Hot), each the one before plus the next part of the seat's hot path in its order
(hot.hot_call), and each ending in the real kernel call:

  1 call       a module's Python ``__call__`` that calls the kernel: what calling any module costs
  2 signature  ``(x=UNSET, *args, **kwargs)`` and its test: one positional argument, nothing else
  3 dynamo     ``torch.compiler.is_dynamo_compiling()``
  4 hooks      the seat's four hook dicts, Module.compile(), the four global hook dicts
  5 counter    the capture test and ``calls += 1``
  6 guard      the fast match (guards.tensor_match): the whole hot path, as the seat runs it

and the seat itself beside them. Each figure: the median over steps of (that call - the kernel called
directly in the same step), call by call (bench/call_pairs.py), with its 95% interval; "+step": its
median less the previous one's. On the H200's host each part costs several times its tight-loop
figure here (100-900 ns where a tight loop says 15-150): between two calls of a site, a ~30 us
Triton launch has run, so the seat's code and objects are out of the caches, and each one it
touches is a miss.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

_FAST = "    if args or kwargs or x is UNSET:\n        return None\n"
_HOOKS = "    if (hot.compiled or fwd or fwd_pre or bwd or bwd_pre or G1 or G2 or G3 or G4):\n        return None\n"
_COUNT = (
    "    if U[0] and cuda and capture.stream_capturing():\n        stats.captured += 1\n"
    "    else:\n        stats.calls += 1\n"
)
_GUARD = (
    "    try:\n        ok = hot.fast(x)\n    except (AttributeError, IndexError):\n        ok = False\n"
    "    if not ok:\n        return None\n"
)
_SIG = "def __call__(self, x=UNSET, *args, **kwargs):\n"
_DYN = "    if _dynamo():\n        return None\n"
_KERNEL = "    return call(original, x)\n"
STEPS = {  # each one the step before plus the next part of seats.hot.hot_call, in its order
    "1 call": "def __call__(self, x):\n" + _KERNEL,
    "2 signature": _SIG + _FAST + _KERNEL,
    "3 dynamo": _SIG + _DYN + _FAST + _KERNEL,
    "4 hooks": _SIG + _DYN + _HOOKS + _FAST + _KERNEL,
    "5 counter": _SIG + _DYN + _HOOKS + _FAST + _COUNT + _KERNEL,
    "6 guard": _SIG + _DYN + _HOOKS + _FAST + _COUNT + _GUARD + _KERNEL,
}


def chain(seat) -> dict:
    """name -> a callable object per step, over this seat's state; counting into stats of its own."""
    import torch
    from torch.nn.modules.module import (
        _global_backward_hooks,
        _global_backward_pre_hooks,
        _global_forward_hooks,
        _global_forward_pre_hooks,
    )

    from frt.seats import capture
    from frt.seats.hot import UNSET, SeatStats

    hot = seat._hot
    scope = {
        "call": hot.call,
        "original": hot.original,
        "UNSET": UNSET,
        "hot": hot,
        "fwd": hot.fwd,
        "fwd_pre": hot.fwd_pre,
        "bwd": hot.bwd,
        "bwd_pre": hot.bwd_pre,
        "G1": _global_forward_hooks,
        "G2": _global_forward_pre_hooks,
        "G3": _global_backward_hooks,
        "G4": _global_backward_pre_hooks,
        "U": capture.UNDERWAY,
        "cuda": hot.cuda,
        "capture": capture,
        "stats": SeatStats(),
        "_dynamo": torch.compiler.is_dynamo_compiling,
    }
    out = {}
    for name, body in STEPS.items():
        ns = dict(scope)
        exec(
            compile(
                "class Step:\n" + "".join("    " + line + "\n" for line in body.splitlines()),
                f"<bench.seat_cost {name}>",
                "exec",
            ),
            ns,
        )
        out[name] = ns["Step"]()
    return out


def decompose(seat, module, x, budget: float, sync) -> list[tuple[str, float, float, float]]:
    """(name, median ns over direct, 95% low, 95% high) for each step and the seat, beside the real call,
    call by call (bench.call_pairs); last, ("direct", its median ns, 0, 0)."""
    from . import call_pairs

    def direct(x, m=module, f=seat._call):
        return f(m, x)

    seat(x)
    seat(x)  # the fast match is set by the first admitted call
    fns = {"direct": direct, **chain(seat), "seat": seat}
    for name, fn in fns.items():
        if name != "direct" and fn(x) is None:
            raise SystemExit(f"bench.seat_cost: step {name!r} did not take the kernel (the guard refused {x.shape})")
    cs = call_pairs.per_call_steps(fns, x, call_pairs.steps_for(fns, x, budget, sync), sync)
    rows = []
    for name in fns:
        if name != "direct":
            p = call_pairs.paired(cs, name, "direct")
            rows.append((name, p.ns, p.low, p.high))
    rows.append(("direct", p.base_us * 1e3, 0.0, 0.0))
    return rows


def render(label: str, rows) -> list[str]:
    *steps, (_, direct_ns, _, _) = rows
    out = [
        f"{label}: direct {direct_ns / 1e3:.2f} us per call; ns over direct (95% interval), +step over the step before"
    ]
    prev = 0.0
    for name, ns, lo, hi in steps:
        inc = "" if name == "seat" else f"  +step {ns - prev:+5.0f}"
        out.append(f"  {name:12} {ns:+6.0f} [{lo:+5.0f}, {hi:+5.0f}]{inc}  ({ns / direct_ns * 100:+.1f}%)")
        prev = ns
    return out


def seated_site(kind: str, module, kernel, device: str, dtype, home: Path):
    """(the seat, its handle): ``module`` as the one site of a host model, seated with ``kernel``."""
    import torch

    from frt.manifests import SeatCatalog, SeatSpec
    from frt.seats import attach

    host = torch.nn.Sequential()
    host.add_module("site", module)
    if kind == "activation":  # an activation owns no weights: the host's dtype and device come from here
        host.add_module("anchor", torch.nn.Linear(1, 1))
    host.to(device=device, dtype=dtype).eval()
    handle = attach(host, SeatCatalog((SeatSpec(kind, kernel, match=("site",)),)), home=home, strict=True)
    return host.site, handle


def cases(device: str, home: Path):
    """(label, seat, module, x, handle) per case: the fixture kernels of this device, in a one-site host."""
    import torch
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    from frt.manifests import KernelRef
    from tests.support.seat_fixtures import RMSNORM, TRITON

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    kernels = {"norm": KernelRef(TRITON if device == "cuda" else RMSNORM, version=1, layer="RMSNorm")}
    if device == "cuda":
        kernels["activation"] = KernelRef(TRITON, version=1, function="silu")
    shapes = [("norm", 1, 1024), ("norm", 16, 1024)] + ([("activation", 16, 3072)] if device == "cuda" else [])
    for kind, rows, width in shapes:
        module = Qwen3RMSNorm(width) if kind == "norm" else torch.nn.SiLU()
        seat, handle = seated_site(kind, module, kernels[kind], device, dtype, home)
        x = torch.randn(rows, width, device=device, dtype=dtype)
        yield f"{kind} {rows}x{width} ({str(dtype).removeprefix('torch.')}, {device})", seat, module, x, handle


def own_cost_line(device: str = "cpu") -> str:
    """The seat's own cost on this host: a seat whose kernel returns its input, against that kernel
    called directly, on a decode-sized bf16 tensor; a plain Python call beside it, for the host's speed."""
    import torch
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    from frt.seats.guards import Guard
    from frt.seats.seat import Seat

    from .call_loops import medians, paired, per_call_us

    def kernel(m, x):
        return x

    def nothing(x):
        return x

    module = Qwen3RMSNorm(1024)
    seat = Seat(module, kernel, Guard((torch.bfloat16,), (device,), 1024, None), "site", "norm")
    x = torch.zeros(16, 1, 1024, dtype=torch.bfloat16, device=device)
    rs = per_call_us(
        {"direct": lambda x, m=module, f=kernel: f(m, x), "seat": seat, "python call": nothing}, x, 20000, 21
    )
    t, (_, cost) = medians(rs), paired(rs, "seat", "direct")
    return (
        f"the seat's own cost on this host ({device} tensor, a kernel that returns its input): "
        f"{cost * 1e3:.0f} ns per call (seat {t['seat'] * 1e3:.0f} ns, direct {t['direct'] * 1e3:.0f} ns; "
        f"a bare Python call here: {t['python call'] * 1e3:.0f} ns)"
    )


def report(device: str, home: Path, quick: bool) -> list[str]:
    import torch

    budget = 0.2 if quick else 3.0
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    out = [f"where a seat's cost goes, beside its kernel's launch (call by call, ~{budget:g} s of steps per site):"]
    with torch.no_grad():
        for label, seat, module, x, handle in cases(device, home):
            out += render(label, decompose(seat, module, x, budget, sync))
            handle.detach()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.seat_cost", description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--quick", action="store_true", help="fewer rounds (smoke test)")
    args = ap.parse_args()
    import torch

    from tests.support.seat_fixtures import staged_home

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        home = staged_home(Path(tmp))
        print("\n".join(report(args.device, home, args.quick)))
    print(own_cost_line(args.device))


if __name__ == "__main__":
    main()
