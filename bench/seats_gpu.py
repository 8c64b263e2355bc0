"""bench/seats.py --device cuda: decode tok/s eager and under CUDA graphs, per-call cost, the targets.

Model: a Qwen3-0.6B-shaped transformers Qwen3 (28 layers, hidden 1024, 16/8 heads of 128, MLP 3072,
vocab 151,936, tied head), bf16, random weights. Two kernel sets, each staged by the real stager from
the fake Hub and seated from the home:

- fixtures: every RMSNorm (q/k norms included) and the MLP's SiLU take the Triton fixture kernels
  (torch-cuda), the LM head its row slabs of the pure-torch linear;
- liger: Liger-Kernel 0.8.5's own RMSNorm (every norm) and SwiGLU (each MLP block whole), packaged
  from its wheel as a torch-cuda Hub kernel (tests/support/liger_fixture.py).

Decode: greedy, a 16-token prompt then 48 steps over a transformers StaticCache
(tests/support/graph_decode.py), batch 1 and 16; "eager" runs each step's forward, "graphs" replays the step
captured once with torch.cuda.CUDAGraph. Sides: base (no kernels), kernelized (each kernel bound as
its module's forward, no seat: what kernels.kernelize does) and seated. Rounds alternate the sides so
drift hits all; the tok/s printed are each side's best, the ratios the medians of each round's own.
The graphs are captured once per side and batch and replayed in every round (a graph records the
model as it was at capture). Timed: the decode steps, not the prefill.

Per call: decode- and prefill-sized calls of each kernel, module / direct / kernelized / seat, each
loop ending in a device sync. Then the issue's targets, each PASS or MISS with its numbers.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import statistics
import time
from pathlib import Path
from types import MethodType

PROMPT, NEW = 16, 48
PER_CALL, PER_CALL_QUICK = (0.01, 31), (0.005, 7)  # per-call: (seconds per loop, rounds)
PAIRED_S = {False: 2.0, True: 0.1}  # per-call, call by call: seconds per site (quick or not)
DEVICE = "cuda"  # one name for every tensor here, so that a CPU dry run can swap it
# Per-call cases (kind, rows, width): decode-sized (launch-bound: the seat's Python is what shows), then
# prefill-sized, where the GPU's own time covers it. Each kernel set runs the kinds it seats.
CASES = [
    ("norm", 1, 1024),
    ("norm", 16, 1024),
    ("norm", 16 * 16, 128),
    ("activation", 1, 3072),
    ("activation", 16, 3072),
    ("mlp", 1, 1024),
    ("mlp", 16, 1024),
    ("norm", 16384, 1024),
    ("activation", 16384, 3072),
    ("mlp", 16384, 1024),
]


@contextlib.contextmanager
def bound_in_place(handle):
    """While attached: each seat's kernel call bound as its original module's forward, and the
    original put back in the seat's place; afterwards the seats again. The same kernels, no seat."""
    for r in handle.records:
        r.original.forward = MethodType(r.seat._call, r.original)
        setattr(r.parent, r.attr, r.original)
    try:
        yield
    finally:
        for r in handle.records:
            del r.original.forward
            setattr(r.parent, r.attr, r.seat)


def kernel_sets():
    """name -> catalog, for the kernel sets this host can stage; and a note per set it cannot."""
    from frt.manifests import KernelRef, SeatCatalog, SeatSpec
    from tests.support.liger_fixture import LIGER
    from tests.support.seat_fixtures import LINEAR, TRITON, liger_problem

    sets = {
        "fixtures": SeatCatalog(
            (
                SeatSpec("norm", KernelRef(TRITON, version=1, layer="RMSNorm"), match_class=("Qwen3RMSNorm",)),
                SeatSpec("activation", KernelRef(TRITON, version=1, function="silu"), match=("mlp.act_fn",)),
                SeatSpec(
                    "lm_head", KernelRef(LINEAR, version=1, function="linear"), match=("lm_head",), tolerance=2e-2
                ),
            )
        )
    }
    notes = {}
    if liger_problem():
        notes["liger"] = liger_problem()
    else:
        sets["liger"] = SeatCatalog(
            (
                SeatSpec("norm", KernelRef(LIGER, version=1, layer="RMSNorm"), match_class=("Qwen3RMSNorm",)),
                SeatSpec("mlp", KernelRef(LIGER, version=1, layer="SwiGLUMLP"), match=("mlp",)),
            )
        )
    return sets, notes


def build_model(layers: int):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=layers,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
    )
    torch.manual_seed(0)
    with torch.device(DEVICE):
        return Qwen3ForCausalLM(cfg).to(torch.bfloat16).eval()


def _timed(dec, graphs: bool) -> tuple[float, object]:
    """tok/s of the decode steps. The garbage collector is off while they run, as in timeit: attach and
    detach leave cyclic garbage (each seat's own class), and a full collection of this process's heap
    would land on whichever side's decode it fell in."""
    import torch

    dec.prefill()  # eager in both modes, and not decode: off the clock
    torch.cuda.synchronize()
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter()
        out = dec.decode(graphs=graphs)
        torch.cuda.synchronize()
        t = time.perf_counter() - t0
    finally:
        gc.enable()
    return dec.prompt.shape[0] * dec.new / t, out.clone()


def decode_rows(model, catalog, home: Path, batch: int, new: int, rounds: int) -> dict:
    """{(side, mode): best tok/s}, plus 'same' (graph tokens == eager tokens, per side), 'captured'
    (the seated handle's counters just after its capture), 'eager' (a seated handle's after a round's
    runs) and 'line'."""
    import torch

    from frt.seats import attach
    from tests.support.graph_decode import StaticDecoder

    prompt = torch.randint(
        1, model.config.vocab_size, (batch, PROMPT), device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(batch)
    )
    decs = {side: StaticDecoder(model, prompt, new) for side in ("base", "kernelized", "seated")}

    @contextlib.contextmanager
    def side_state(side):
        if side == "base":
            yield None
            return
        handle = attach(model, catalog, home=home, strict=True)
        try:
            if side == "kernelized":
                with bound_in_place(handle):
                    yield handle
            else:
                yield handle
        finally:
            handle.detach()

    out: dict = {"same": {}}
    for side, dec in decs.items():  # capture each side once; warm its eager path too (Triton JIT, plans)
        with side_state(side) as handle:
            dec.run()
            dec.capture()
            if side == "seated":
                out["line"], out["captured"] = handle.line(), handle.summary()
    per_round = {(s, m): [] for s in decs for m in ("eager", "graphs")}
    for _ in range(rounds):
        for side, dec in decs.items():
            with side_state(side) as handle:
                tps, eager_tokens = _timed(dec, graphs=False)
                per_round[side, "eager"].append(tps)
                tps, graph_tokens = _timed(dec, graphs=True)
                per_round[side, "graphs"].append(tps)
                same = bool(torch.equal(eager_tokens, graph_tokens))
                out["same"][side] = out["same"].get(side, True) and same  # in every round
                if side == "seated":
                    out["eager"] = handle.summary()
    del decs
    torch.cuda.empty_cache()
    best = {k: max(v) for k, v in per_round.items()}
    out.update(best)
    # The ratios the targets read: seated against base or kernelized of the same round, then the median
    # over the rounds (drift slower than a round cancels; one slow round moves the median little).
    out["ratio"] = {
        (a, b, m): statistics.median(x / y for x, y in zip(per_round[a, m], per_round[b, m], strict=False))
        for a, b in (("seated", "kernelized"), ("seated", "base"))
        for m in ("eager", "graphs")
    }
    return out


def per_call_rows(home: Path, quick: bool, sets: dict) -> list[tuple]:
    """(label, kernel set, t, loops, calls) per case: t the median us per call of module, direct,
    kernelized and seat in loops; loops {"direct": (ratio, us), "kernelized": (ratio, us)}, seat against
    each, per round; calls {"direct": Paired, "kernelized": Paired}, seat against each, call by call
    (bench.call_pairs: what the per-call target reads)."""
    import torch
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm

    from . import call_pairs
    from .call_loops import median_s, medians, paired, per_call_us
    from .seat_cost import seated_site

    cfg = Qwen3Config(hidden_size=1024, intermediate_size=3072)
    budget, rounds = PER_CALL_QUICK if quick else PER_CALL
    rows = []
    for set_name, catalog in sets.items():
        specs = {s.kind: s for s in catalog.seats}
        for kind, rows_, width in CASES:
            if kind not in specs:
                continue
            make = {"norm": lambda width=width: Qwen3RMSNorm(width), "activation": torch.nn.SiLU}
            module = make.get(kind, lambda: Qwen3MLP(cfg))()
            seat, handle = seated_site(kind, module, specs[kind].kernel, DEVICE, torch.bfloat16, home)

            def run_direct(x, m=module, f=seat._call):
                return f(m, x)

            kernelized = copy.deepcopy(module)
            kernelized.forward = MethodType(seat._call, kernelized)
            x = torch.randn(rows_, width, device=DEVICE, dtype=torch.bfloat16)
            fns = {"module": module, "direct": run_direct, "kernelized": kernelized, "seat": seat}
            with torch.no_grad():
                for f in fns.values():
                    f(x)  # JIT and caches warm
                torch.cuda.synchronize()
                t = median_s(lambda s=seat, x=x: (s(x), torch.cuda.synchronize()), 20)
                calls = max(10, min(5000, int(budget / (t or 1e-6))))
                rs = per_call_us(fns, x, calls, rounds, sync=torch.cuda.synchronize)
                steps = call_pairs.steps_for(fns, x, PAIRED_S[quick], sync=torch.cuda.synchronize)
                cs = call_pairs.per_call_steps(fns, x, steps, sync=torch.cuda.synchronize)
            handle.detach()
            rows.append(
                (
                    f"{kind} {rows_}x{width}",
                    set_name,
                    medians(rs),
                    {b: paired(rs, "seat", b) for b in ("direct", "kernelized")},
                    {b: call_pairs.paired(cs, "seat", b) for b in ("direct", "kernelized")},
                )
            )
    return rows


def _mark(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def report(home: Path, quick: bool) -> dict:
    """Run everything and print it, the targets last; return the figures (for --json)."""
    import torch

    layers = 4 if quick else 28
    new, rounds = (8, 1) if quick else (NEW, 6)
    sets, notes = kernel_sets()
    model = build_model(layers)
    print(
        f"\nGPU: {torch.cuda.get_device_name()}; torch {torch.__version__}; model: transformers Qwen3, {layers} "
        f"layers, hidden 1024, vocab 151936 (Qwen3-0.6B's shape), bf16, random weights"
    )
    for name, why in notes.items():
        print(f"kernel set {name}: not run: {why}")
    decode = {}
    for name, catalog in sets.items():
        for batch in (1, 16):
            r = decode_rows(model, catalog, home, batch, new, rounds)
            if r["eager"]["fallbacks"] or r["captured"]["fallbacks"]:
                raise SystemExit(f"bench.seats: {name} batch {batch}: seats fell back: {r['eager']}")
            decode[name, batch] = r
    print(
        f"\ndecode tok/s, greedy, {PROMPT}-token prompt then {new} steps over a StaticCache: the best of {rounds} "
        "rounds, each running base, kernelized, seated in turn (GC off while timed); the ratios: medians of each "
        "round's own. kernelized: the same kernels bound as each module's forward, no seat"
    )
    print(
        f"{'set':9} {'batch':>5} {'mode':7} {'base':>9} {'kernelized':>11} {'seated':>9} {'seated/base':>12} "
        f"{'seated/kernelized':>18}  graph tokens == eager"
    )
    for (name, batch), r in decode.items():
        for mode in ("eager", "graphs"):
            b, k, s = r["base", mode], r["kernelized", mode], r["seated", mode]
            vs_b, vs_k = r["ratio"]["seated", "base", mode], r["ratio"]["seated", "kernelized", mode]
            same = (
                " ".join(f"{side}:{'yes' if ok else 'NO'}" for side, ok in r["same"].items())
                if mode == "graphs"
                else ""
            )
            print(f"{name:9} {batch:>5} {mode:7} {b:>9.1f} {k:>11.1f} {s:>9.1f} {vs_b:>12.3f} {vs_k:>18.3f}  {same}")
    for (name, batch), r in decode.items():
        c = r["captured"]
        print(
            f"{name} batch {batch}: {r['line']}; at capture: {c['captured_calls']} captured calls, "
            f"{c['guarded_calls']} eager, {c['fallbacks']} fallbacks, {c['seats_never_called']} never called"
        )

    from .seat_cost import own_cost_line

    calls = per_call_rows(home, quick, sets)
    budget, rounds = PER_CALL_QUICK if quick else PER_CALL
    print(
        f"\nper call, bf16, us, in loops: the median of {rounds} rounds, each a ~{budget * 1e3:g} ms loop of every "
        "function in turn (the order turned around each round), each loop ending in a sync; loop seat/direct: the "
        "median of each round's own. module: the original; direct: the kernel called as the seat calls it; "
        "kernelized: bound as the module's forward; seat: guard + counters + that call"
    )
    print(
        f"call by call (bench/call_pairs.py): every function once per step, each call timed alone on an idle device "
        f"(~{PAIRED_S[quick]:g} s of steps per site); issued: direct's host time per call; seat-direct: the median "
        "over steps of the seat's call less the direct call of the same step, and its 95% interval; the ratios from it"
    )
    print(
        f"{'site':22} {'set':9} {'module':>8} {'direct':>8} {'kernelized':>10} {'seat':>8} {'loop s/d':>9} "
        f"{'issued':>8} {'seat-direct ns (95%)':>24} {'seat/direct':>12} {'seat/kernelized':>16} {'steps':>6}"
    )
    for label, name, t, loops, pc in calls:
        d, k = pc["direct"], pc["kernelized"]
        ci = f"{d.ns:+.0f} [{d.low:+.0f}, {d.high:+.0f}]"
        print(
            f"{label:22} {name:9} {t['module']:>8.2f} {t['direct']:>8.2f} {t['kernelized']:>10.2f} "
            f"{t['seat']:>8.2f} {loops['direct'][0]:>8.3f}x {d.base_us:>8.2f} {ci:>24} {d.ratio:>11.3f}x "
            f"{k.ratio:>15.3f}x {d.steps:>6}"
        )
    print(own_cost_line(DEVICE))
    from .seat_cost import report as cost_report

    cost = cost_report(DEVICE, home, quick)
    print("\n" + "\n".join(cost))

    print("\ntargets (issue #18):")
    for name in sets:
        for mode, bound in (("graphs", 0.99), ("eager", 0.98)):
            ratios = {b: decode[name, b]["ratio"]["seated", "kernelized", mode] for b in (1, 16)}
            worst = min(ratios.values())
            print(
                f"  {_mark(worst >= bound)} {mode} seated/kernelized >= {bound} ({name}): "
                + ", ".join(f"batch {b} {v:.3f}" for b, v in ratios.items())
            )
    big = [(label, name, pc["direct"]) for label, name, _, _, pc in calls if pc["direct"].base_us >= 30]
    if big:
        label, name, w = max(big, key=lambda c: c[2].ratio)
        print(
            f"  {_mark(w.ratio <= 1.03)} eager per-call seat/direct <= 1.03 for calls >= 30 us (call by call): "
            f"worst {w.ratio:.3f}, 95% interval up to {w.ratio_high:.3f} ({label}, {name}, direct {w.base_us:.1f} us, "
            f"seat {w.ns:+.0f} ns; {len(big)} such calls)"
        )
    else:
        print("  n/a eager per-call seat/direct <= 1.03 for calls >= 30 us: no measured call took 30 us")
    if "liger" in sets:
        for b in (1, 16):
            r = decode["liger", b]
            g, e = r["ratio"]["seated", "base", "graphs"], r["ratio"]["seated", "base", "eager"]
            print(f"  {_mark(g > 1)} liger graphs seated/base > 1, batch {b}: {g:.3f} (eager, printed beside: {e:.3f})")
    else:
        print(f"  MISS liger graphs seated/base > 1: not run ({notes['liger']})")
    same = all(all(r["same"].values()) for r in decode.values())
    print(f"  {'ok' if same else 'DIFFERS'} graph-replayed tokens equal the eager steps' tokens, every side and batch")
    return {
        "decode": {
            f"{n} b{b} {side} {mode}": v
            for (n, b), r in decode.items()
            for (side, mode), v in ((k, r[k]) for k in r if isinstance(k, tuple))
        },
        "ratios": {f"{n} b{b} {a}/{c} {m}": v for (n, b), r in decode.items() for (a, c, m), v in r["ratio"].items()},
        "same": {f"{n} b{b}": r["same"] for (n, b), r in decode.items()},
        "per_call_us": {f"{label} {name}": t for label, name, t, _, _ in calls},
        "per_call_seat_vs": {f"{label} {name}": p for label, name, _, p, _ in calls},
        "per_call_paired": {
            f"{label} {name}": {b: {**vars(v), "ratio": v.ratio} for b, v in pc.items()}
            for label, name, _, _, pc in calls
        },
        "seat_cost": cost,
        "notes": notes,
    }
