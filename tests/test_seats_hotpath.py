"""The seat's hot path on CPU: what it counts and how (eager, compiled), what its guard still refuses,
and that copies, Module.compile() and whole-MLP seats keep working through it.

The GPU half (calls recorded into a CUDA graph, counted as ``captured``) is in tests/test_seats_gpu.py.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from torch._dynamo.testing import CompileCounterWithBackend  # noqa: E402

from frt.manifests import EXAMPLES, KernelRef, SeatCatalog, SeatSpec, SeatSpecError, load_seat_catalog  # noqa: E402
from frt.seats import attach  # noqa: E402
from tests.support.seat_fixtures import (  # noqa: E402
    ACTIVATION,
    RMSNORM,
    generate,
    logits,
    rel,
    tiny_qwen3,
)

EXAMPLE = load_seat_catalog(EXAMPLES / "seats-qwen3.toml")
NORM_ONLY = SeatCatalog((SeatSpec("norm", KernelRef(RMSNORM, version=1, layer="RMSNorm"), match=("model.norm",)),))


def test_compiled_seats_count_their_traces_not_their_calls_and_never_recompile(seats_home):
    model = tiny_qwen3()
    handle = attach(model, EXAMPLE, home=seats_home)
    ids = torch.randint(0, 320, (2, 9), generator=torch.Generator().manual_seed(3))
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    with torch.no_grad():
        for _ in range(3):
            compiled(ids)
    s = handle.summary()
    assert counter.frame_count == 1  # a counter the graph read would have been a guard: one compile per call
    assert s["compiled_traces"] == s["seats"] == 26 and s["guarded_calls"] == 0
    assert s["seats_never_called"] == 0 and s["clean"]
    with torch.no_grad():
        model(ids)  # and eagerly: every seat once more, counted as a call
    assert handle.summary()["guarded_calls"] == 26
    handle.detach()


def test_the_guard_still_refuses_what_is_not_its_kernels(seats_home):
    model = tiny_qwen3()
    handle = attach(model, NORM_ONLY, home=seats_home)
    seat = model.model.norm
    with torch.no_grad():
        for x in (
            torch.randn(2, 3, 64, dtype=torch.float64),  # dtype
            torch.randn(2, 3, 32),  # width: the original raises, as it would unseated
            torch.tensor(1.0),
        ):  # 0-d: the hot path's IndexError, caught
            try:
                want = seat.original(x)
            except RuntimeError:
                with pytest.raises(RuntimeError):
                    seat(x)
            else:
                assert torch.equal(seat(x), want)
        with pytest.raises(AttributeError):
            seat("not a tensor")  # the original's own error: the guard let it through to the original
        y = seat(hidden_states=torch.randn(1, 2, 64))  # by keyword: the general path, guard and all
    assert y.shape == (1, 2, 64)
    assert (seat.stats.calls, seat.stats.fallbacks) == (5, 4)
    handle.detach()


@pytest.mark.parametrize("fast_match", [True, False], ids=["tensor-guards", "python-check-only"])
def test_after_the_first_admitted_call_the_guard_still_refuses_what_is_not_its_kernels(
    seats_home, monkeypatch, fast_match
):
    """The fast match is specialised on the first admitted tensor; what differs from it goes to the full
    guard, which still decides: admitted (other leading sizes, dims, grad, inference mode) or refused.
    Without torch's TensorGuards (python-check-only) the guard's own check is the fast test."""
    from frt.seats import guards

    monkeypatch.setattr(guards, "_TENSOR_GUARDS", [] if fast_match else [None])
    model = tiny_qwen3()
    handle = attach(model, NORM_ONLY, home=seats_home)
    seat = model.model.norm
    kernel = lambda x: seat._call(seat.original, x)  # noqa: E731
    admitted = [
        torch.randn(1, 2, 64),
        torch.randn(3, 5, 64),
        torch.randn(7, 64),
        torch.randn(2, 1, 64, requires_grad=True),
        torch.randn(1, 64, 2).transpose(1, 2),
    ]
    refused = [torch.randn(1, 2, 64, dtype=torch.float64), torch.randn(1, 2, 32), torch.tensor(1.0), "text"]
    with torch.no_grad():
        assert torch.equal(seat(admitted[0]), kernel(admitted[0]))
        assert type(seat._hot.fast).__name__ == ("builtin_function_or_method" if fast_match else "function")
        for x in admitted[1:] + admitted:
            assert torch.equal(seat(x), kernel(x))
        with torch.inference_mode():
            y = torch.randn(1, 2, 64)
            assert torch.equal(seat(y), kernel(y))
        for x in refused:
            try:
                want = seat.original(x)
            except (RuntimeError, AttributeError) as e:
                with pytest.raises(type(e)):
                    seat(x)
            else:
                assert torch.equal(seat(x), want)
    calls = 2 * len(admitted) + 1 + len(refused)
    assert (seat.stats.calls, seat.stats.fallbacks) == (calls, len(refused))
    assert seat._hot.rematches <= 4  # re-specialised a bounded number of times, not on every change
    handle.detach()


def test_a_copied_seat_counts_for_itself_and_runs_its_own_hooks(seats_home):
    model = tiny_qwen3()
    handle = attach(model, NORM_ONLY, home=seats_home)
    twin = copy.deepcopy(model)
    x, seen = torch.randn(1, 2, 64), []
    twin.model.norm.register_forward_hook(lambda m, i, o: seen.append(m))
    with torch.no_grad():
        twin.model.norm(x)
        twin.model.norm(x)
        model.model.norm(x)
    assert seen == [twin.model.norm] * 2
    assert (twin.model.norm.stats.calls, model.model.norm.stats.calls) == (2, 1)
    assert twin.model.norm._hot.original is twin.model.norm.original  # its own weights, not the source's
    handle.detach()


def test_module_compile_on_a_seat_takes_the_compiled_path(seats_home):
    model = tiny_qwen3()
    handle = attach(model, NORM_ONLY, home=seats_home)
    seat, x = model.model.norm, torch.randn(1, 2, 64)
    with torch.no_grad():
        want = seat(x)
        seat.compile(backend="aot_eager", fullgraph=True)
        assert rel(seat(x), want) < 1e-6
    assert seat.stats.traced == 1 and seat.stats.calls == 1
    handle.detach()


def test_an_mlp_seat_takes_the_whole_block(seats_home):
    model = tiny_qwen3()
    ids = torch.randint(0, 320, (2, 7), generator=torch.Generator().manual_seed(0))
    base, base_tokens = logits(model, ids), generate(model, ids)
    cat = SeatCatalog((SeatSpec("mlp", KernelRef(ACTIVATION, version=1, layer="GatedMLP"), match=("mlp",)),))
    handle = attach(model, cat, home=seats_home, strict=True)
    assert [r.site for r in handle.records] == ["model.layers.0.mlp", "model.layers.1.mlp"]
    assert handle.notes["nested"] == []  # the block's projections are not in this catalog
    assert all(r.parity.error < 1e-6 for r in handle.records)
    assert rel(logits(model, ids), base) < 1e-5 and torch.equal(generate(model, ids), base_tokens)
    handle.detach()
    assert torch.equal(logits(model, ids), base)
    with pytest.raises(SeatSpecError, match="an mlp seat needs a layer"):
        SeatSpec("mlp", KernelRef(ACTIVATION, version=1, function="silu"), match=("mlp",))


def test_the_static_cache_decode_loop_is_a_decode(seats_home):
    """tests/support/graph_decode.py's step, run eagerly here (the GPU tests replay it as a CUDA graph): with
    seats attached, its tokens are generate's and its logits what one plain forward predicts."""
    from tests.support.graph_decode import StaticDecoder, teacher_forced_logits

    model = tiny_qwen3()
    handle = attach(model, EXAMPLE, home=seats_home)
    prompt = torch.randint(1, 320, (2, 7), generator=torch.Generator().manual_seed(4))  # 0 is generate's pad
    dec = StaticDecoder(model, prompt, new=6, keep_logits=True)
    tokens = dec.run()
    assert torch.equal(tokens, generate(model, prompt, n=7)[:, 7:])
    assert rel(dec.logits, teacher_forced_logits(model, prompt, tokens)) < 1e-5
    assert torch.equal(dec.run(), tokens)  # a second run starts from a clean cache
    handle.detach()
