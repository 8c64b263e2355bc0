"""Seats on a CUDA GPU with Triton kernels: the CPU suite's scenarios, on the device, then decode under
CUDA graphs and a kernel library nobody here wrote (Liger-Kernel's RMSNorm and SwiGLU).

The Triton fixtures (`seat-triton`, a noarch ``torch-cuda`` variant) are staged only where the host is
a CUDA one; `seat-triton-sm80` declares archs ``["8.0"]`` so that the arch check has a build to refuse
on a newer device. `liger-kernels` is Liger's own code from its wheel (tests/support/liger_fixture.py), staged
and resolved like any other kernel. Every test here needs a CUDA device and skips, saying so, where
there is none (CI has no GPU: these ran on an H200, see the README's "GPU tests"); the Liger ones also
skip, saying so, where no liger-kernel 0.8.5 wheel is at hand.
"""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device here: the Triton seat tests need one"
)

from frt.manifests import EXAMPLES, KernelRef, SeatCatalog, SeatSpec, load_seat_catalog  # noqa: E402
from frt.resolver.resolution import KernelUnavailable
from frt.seats import MoeSeat, Seat, SeatsRefused, attach  # noqa: E402
from tests.support.graph_decode import StaticDecoder, teacher_forced_logits  # noqa: E402
from tests.support.liger_fixture import LIGER  # noqa: E402
from tests.support.seat_fixtures import (  # noqa: E402
    LINEAR,
    TRITON,
    TRITON_SM80,
    WRONG,
    Baseline,
    attach_within,
    generate,
    liger_problem,
    logits,
    rel,
    tiny_qwen3,
    tiny_qwen3_moe,
)

EXAMPLE = load_seat_catalog(EXAMPLES / "seats-qwen3.toml")


def with_triton(catalog: SeatCatalog) -> SeatCatalog:
    """The example catalog with its norms and activation taken by the Triton kernels; the rest (pure
    torch, torch-universal) stays, so one model mixes a torch-cuda and a universal variant."""
    swap = {
        "norm": KernelRef(TRITON, version=1, layer="RMSNorm"),
        "activation": KernelRef(TRITON, version=1, function="silu"),
    }
    return SeatCatalog(tuple(dataclasses.replace(s, kernel=swap.get(s.kind, s.kernel)) for s in catalog.seats))


CATALOG = with_triton(EXAMPLE)
# Liger's kernels where they fit a transformers Qwen3: every RMSNorm, and each MLP block whole (its
# SiLU-and-mul fused between the block's own projections).
LIGER_CATALOG = SeatCatalog(
    (
        SeatSpec("norm", KernelRef(LIGER, version=1, layer="RMSNorm"), match_class=("Qwen3RMSNorm",)),
        SeatSpec("mlp", KernelRef(LIGER, version=1, layer="SwiGLUMLP"), match=("mlp",)),
    )
)
# Only where there is a GPU: without one, the module's own skip (no CUDA device) is the reason shown.
needs_liger = pytest.mark.skipif(
    torch.cuda.is_available() and liger_problem() is not None, reason=f"Liger: {liger_problem()}"
)


def on_gpu(model, dtype=torch.float32):
    return model.to(device="cuda", dtype=dtype)


def ids_on_gpu(rows: int, cols: int, seed: int = 0):
    return torch.randint(0, 320, (rows, cols), generator=torch.Generator().manual_seed(seed)).cuda()


def test_triton_seats_attach_generate_and_detach_bit_identical(seats_home):
    model = on_gpu(tiny_qwen3())
    ids = ids_on_gpu(2, 7)
    base = Baseline(model, ids)

    handle = attach(model, CATALOG, home=seats_home)
    assert handle.notes["refused"] == [] and handle.line() == "[frt.seats] 26 seats (5 head slabs), 0 refused"
    variants = {r.kernel.split()[0]: r.variant for r in handle.records}
    assert variants == {TRITON: "torch-cuda", LINEAR: "torch-universal"}  # this host's choice, per repo
    assert all(r.parity.error <= r.parity.bound for r in handle.records)
    assert rel(logits(model, ids), base.logits) < 1e-5
    assert torch.equal(generate(model, ids), base.tokens)
    s = handle.summary()
    assert s["fallbacks"] == 0 and s["seats_never_called"] == 0 and s["clean"]

    handle.detach()
    base.assert_restored()


def test_bfloat16_on_gpu_within_the_dtype_bound(seats_home):
    model = on_gpu(tiny_qwen3(), torch.bfloat16)
    attach_within(model, ids_on_gpu(1, 6, seed=1), CATALOG, seats_home, seats=26, bound=3e-2)


def test_arch_check_uses_the_modules_device_and_strict_refuses(seats_home):
    model = on_gpu(tiny_qwen3())
    cat = SeatCatalog((SeatSpec("norm", KernelRef(TRITON_SM80, version=1, layer="RMSNorm"), match=("model.norm",)),))
    major, minor = torch.cuda.get_device_capability()
    handle = attach(model, cat, home=seats_home)
    if major == 8:  # a plain 8.0 cubin runs on 8.x: nothing to refuse on this device
        assert handle.notes["refused"] == []
    else:
        assert handle.notes["refused"] == [
            (
                "model.norm",
                f"CUDA capability {major}.{minor} of the module's device "
                "is not among the variant's declared archs (8.0)",
            )
        ]
        with pytest.raises(SeatsRefused) as ei:
            attach(model, cat, home=seats_home, strict=True)
        assert isinstance(ei.value, KernelUnavailable) and not isinstance(model.model.norm, Seat)
    handle.detach()


def test_a_cuda_variant_is_refused_for_a_module_on_the_cpu(seats_home):
    model = tiny_qwen3()  # stays on the CPU of a CUDA host: the host resolves torch-cuda, the module cannot run it
    handle = attach(model, CATALOG, home=seats_home)
    reasons = dict(handle.notes["refused"])
    assert reasons["model.norm"] == "variant torch-cuda is built for cuda, the module is on cpu"
    assert reasons["model.layers.0.mlp.act_fn"] == "variant torch-cuda is built for cuda, the module is on cpu"
    assert {r.kind for r in handle.records} == {"linear", "lm_head"}  # the universal ones still attach
    handle.detach()


def test_the_wrong_kernel_is_refused_by_parity_on_gpu(seats_home):
    model = on_gpu(tiny_qwen3())
    cat = SeatCatalog(
        (
            SeatSpec("norm", KernelRef(WRONG, version=1, layer="RMSNorm"), match=("input_layernorm",)),
            SeatSpec("norm", KernelRef(TRITON, version=1, layer="RMSNorm"), match=("model.norm",)),
        )
    )
    handle = attach(model, cat, home=seats_home)
    reasons = dict(handle.notes["refused"])
    assert sorted(reasons) == ["model.layers.0.input_layernorm", "model.layers.1.input_layernorm"]
    assert all("parity: relative error" in r for r in reasons.values())
    assert [r.site for r in handle.records] == ["model.norm"]
    handle.detach()


def test_band_on_gpu_prefill_original_decode_kernel(seats_home):
    model = on_gpu(tiny_qwen3_moe())
    ids = ids_on_gpu(1, 20)  # prefill: 20 rows > band 16
    base = generate(model, ids, n=4)
    handle = attach(model, CATALOG, home=seats_home)
    assert handle.notes["refused"] == []
    experts = [r for r in handle.records if r.kind == "moe_experts"]
    assert len(experts) == 2 and all(isinstance(r.seat, MoeSeat) for r in experts)
    assert torch.equal(generate(model, ids, n=4), base)
    s = handle.summary()
    assert (s["band_original"], s["band_kernel"]) == (2, 6) and s["clean"]
    handle.detach()


@pytest.mark.parametrize(
    "catalog", [CATALOG, pytest.param(LIGER_CATALOG, marks=needs_liger)], ids=["triton-fixtures", "liger"]
)
def test_graph_captured_decode_equals_eager_seated_decode(seats_home, catalog):
    """The decode step captured once with torch.cuda.CUDAGraph over a StaticCache, seats attached: its
    replays give the tokens and logits of the same steps run eagerly. The seats' Python ran at capture
    only: those calls are counted as captured, and no replay moves a counter."""
    model = on_gpu(tiny_qwen3())
    prompt = ids_on_gpu(2, 7, seed=4)
    handle = attach(model, catalog, home=seats_home, strict=True)
    seats = len(handle.records)
    dec = StaticDecoder(model, prompt, new=8, keep_logits=True)
    eager = dec.run().clone()
    eager_logits = dec.logits.clone()
    # The hand-made loop is a decode: its step logits are what one plain forward over the tokens predicts.
    assert rel(eager_logits, teacher_forced_logits(model, prompt, eager)) < 1e-4
    dec.capture()
    at_capture = handle.summary()
    assert at_capture["captured_calls"] == seats  # one step recorded: each seat once
    replayed = dec.run(graphs=True).clone()
    torch.cuda.synchronize()
    assert torch.equal(replayed, eager)
    assert rel(dec.logits, eager_logits) < 1e-6
    s = handle.summary()
    assert s["captured_calls"] == seats and s["guarded_calls"] == at_capture["guarded_calls"] + seats  # the prefill
    assert s["fallbacks"] == 0 and s["seats_never_called"] == 0
    handle.detach()


@needs_liger
@pytest.mark.parametrize("dtype,bound", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)], ids=["fp32", "bf16"])
def test_liger_kernels_parity_generate_and_detach_bit_identical(seats_home, dtype, bound):
    import sys

    model = on_gpu(tiny_qwen3(), dtype)
    ids = ids_on_gpu(2, 7, seed=5)
    base = Baseline(model, ids)
    handle = attach(model, LIGER_CATALOG, home=seats_home, strict=True)
    # 2 layers x (input, post-attention, q and k norms) + the final norm; 2 MLP blocks
    assert sorted(r.kind for r in handle.records) == ["mlp"] * 2 + ["norm"] * 9
    assert {r.variant for r in handle.records} == {"torch-cuda"}
    assert all(r.parity.error <= r.parity.bound for r in handle.records)
    assert "liger_kernel" not in sys.modules  # the staged copy ran, not an installed liger-kernel
    assert rel(logits(model, ids), base.logits) < bound
    tokens = generate(model, ids)
    seated_along = logits(model, tokens)
    s = handle.summary()
    assert s["fallbacks"] == 0 and s["seats_never_called"] == 0 and s["clean"]
    handle.detach()
    base.assert_restored()
    # generate, equal within the bound: in fp32 the very tokens; bf16 rounding may flip a near-tie, so
    # what is bounded there is the logits along the seated run's tokens against the unseated model's.
    if dtype == torch.float32:
        assert torch.equal(tokens, base.tokens)
    assert rel(seated_along, logits(model, tokens)) < bound


# Last: Inductor's compile is the slowest step here.
@pytest.mark.parametrize("make", [tiny_qwen3, tiny_qwen3_moe], ids=["qwen3", "qwen3-moe"])
def test_compiled_model_with_triton_seats_matches_eager(seats_home, make):
    model = on_gpu(make())
    handle = attach(model, CATALOG, home=seats_home)
    assert handle.notes["refused"] == []
    ids = ids_on_gpu(2, 9, seed=3)
    # Inductor with the user-defined Triton kernels inside the graph, no break (fullgraph).
    compiled = torch.compile(model, backend="inductor", fullgraph=True)
    with torch.no_grad():
        eager, traced = model(ids).logits, compiled(ids).logits
    assert rel(traced, eager) < 1e-4
    handle.detach()
