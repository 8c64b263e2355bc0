"""Seats on a transformers Qwen3-MoE: the expert bank's row band, on both sides, eager and compiled.

At or below the band the kernel serves (decode: one row per sequence), above it the original bank
(prefill). The branch lives in the custom op ``frt_seats::moe_band``, so one compiled graph takes
both arms at run time.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from torch._dynamo.testing import CompileCounterWithBackend  # noqa: E402

from frt.manifests import EXAMPLES, KernelRef, SeatCatalog, SeatSpec, load_seat_catalog  # noqa: E402
from frt.seats import MoeSeat, Seat, attach  # noqa: E402
from frt.seats import band as band_module  # noqa: E402
from tests.support.seat_fixtures import (  # noqa: E402
    ACTIVATION,
    EXPERTS,
    rel,
    tiny_qwen3,
    tiny_qwen3_moe,
)

EXAMPLE = load_seat_catalog(EXAMPLES / "seats-qwen3.toml")
EXPERTS_ONLY = SeatCatalog(
    (SeatSpec("moe_experts", KernelRef(EXPERTS, version=1, layer="ExpertBank"), match=("mlp.experts",)),)
)  # band: $FRT_MOE_BAND_T at attach


def routed(model, rows: int, seed: int = 0):
    """Inputs of the first layer's expert bank, routed by the model's own router."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, 64, generator=gen)
    with torch.no_grad():
        _, weights, index = model.model.layers[0].mlp.gate(hidden)
    return hidden, index, weights


def test_generate_prefill_goes_to_the_original_and_decode_to_the_kernel(seats_home):
    model = tiny_qwen3_moe()
    ids = torch.randint(0, 320, (1, 20), generator=torch.Generator().manual_seed(0))  # prefill: 20 rows > 16
    with torch.no_grad():
        base_logits, base = model(ids).logits, model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
    handle = attach(model, EXAMPLE, home=seats_home)
    assert handle.notes["refused"] == [] and handle.notes["unmatched"] == ["silu"]  # a MoE MLP has no mlp.act_fn
    experts = [r for r in handle.records if r.kind == "moe_experts"]
    assert [r.site for r in experts] == ["model.layers.0.mlp.experts", "model.layers.1.mlp.experts"]
    assert all(isinstance(r.seat, MoeSeat) and r.seat.band == 16 for r in experts)

    with torch.no_grad():
        got = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert torch.equal(got, base)
    s = handle.summary()
    # 2 layers: one prefill forward (20 rows, the original) and 3 decode forwards (1 row, the kernel).
    assert (s["band_original"], s["band_kernel"]) == (2, 6) and s["clean"]

    keys = [r.seat.key for r in experts]
    assert all(k in band_module._SEATS for k in keys)
    handle.detach()
    assert not any(k in band_module._SEATS for k in keys)  # the op's table holds only attached seats
    with torch.no_grad():
        assert torch.equal(model(ids).logits, base_logits)


def test_band_edges_exactly_and_from_the_environment(seats_home):
    model = tiny_qwen3_moe()
    silu = SeatSpec("activation", KernelRef(ACTIVATION, version=1, function="silu"), match_class=("SiLUActivation",))
    catalog = SeatCatalog(EXPERTS_ONLY.seats + (silu,))
    handle = attach(model, catalog, home=seats_home, environ={"FRT_MOE_BAND_T": "4"})
    # The bank's own act_fn is inside the experts seat: the outer seat owns it, so it is not seated.
    assert handle.notes["nested"] == ["model.layers.0.mlp.experts.act_fn", "model.layers.1.mlp.experts.act_fn"]
    assert handle.notes["unmatched"] == ["SiLUActivation"]
    seat = model.model.layers[0].mlp.experts
    assert seat.band == 4
    for rows, side in ((4, "band_kernel"), (5, "band_original"), (1, "band_kernel"), (64, "band_original")):
        before = (seat.stats.band_kernel, seat.stats.band_original)
        args = routed(model, rows)
        with torch.no_grad():
            out, want = seat(*args), seat.original(*args)
        assert rel(out, want) < 1e-5
        after = (seat.stats.band_kernel, seat.stats.band_original)
        assert after[side == "band_original"] == before[side == "band_original"] + 1, (rows, side)
        assert after[side != "band_original"] == before[side != "band_original"]
    handle.detach()


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_one_compiled_graph_takes_both_arms_of_the_band(seats_home, backend):
    """dynamic=True, fullgraph=True: the 4-row and the 40-row call share one graph, and each reaches
    its own arm at run time (a Python branch on the row count would have been frozen in the trace)."""
    model = tiny_qwen3_moe()
    handle = attach(model, EXPERTS_ONLY, home=seats_home, environ={"FRT_MOE_BAND_T": "8"})
    block = model.model.layers[0].mlp  # router + seated experts
    seat = block.experts
    counter = CompileCounterWithBackend(backend)
    compiled = torch.compile(block, backend=counter, dynamic=True, fullgraph=True)
    for rows in (4, 40, 3, 33):
        x = torch.randn(1, rows, 64, generator=torch.Generator().manual_seed(rows))
        with torch.no_grad():
            assert rel(compiled(x), block(x)) < 1e-6
    assert counter.frame_count == 1
    assert (seat.stats.band_kernel, seat.stats.band_original) == (4, 4)  # each arm, eager and compiled
    handle.detach()


@pytest.mark.parametrize("make", [tiny_qwen3, tiny_qwen3_moe], ids=["qwen3", "qwen3-moe"])
def test_compiled_model_with_seats_matches_eager(seats_home, make):
    model = make()
    handle = attach(model, EXAMPLE, home=seats_home)
    assert handle.notes["refused"] == []
    ids = torch.randint(0, 320, (2, 9), generator=torch.Generator().manual_seed(3))
    # fullgraph: the seats (guards, kernel calls, head slabs, the band op) trace without a graph break.
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        eager, traced = model(ids).logits, compiled(ids).logits
    assert rel(traced, eager) < 1e-5
    assert all(isinstance(m, Seat) for m in (model.lm_head, model.model.norm))
    handle.detach()
