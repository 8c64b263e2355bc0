"""Seats on a dense transformers Qwen3: attach staged kernels, generate, refuse with reasons, detach exactly.

The kernels are the fixture repos of tests/support/seat_fixtures.py, staged once for this host with the real
`frt-mirror stage` from a fake Hub that is gone by the time anything is attached.
"""

from __future__ import annotations

import importlib
import logging
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from frt.manifests import EXAMPLES, Guards, KernelRef, SeatCatalog, SeatSpec, load_seat_catalog  # noqa: E402
from frt.resolver.resolution import KernelUnavailable
from frt.seats import Seat, SeatRecord, SeatsRefused, arch_problem, attach, rocm_arch_problem  # noqa: E402
from tests.support.seat_fixtures import (  # noqa: E402
    LINEAR,
    RMSNORM,
    WRONG,
    Baseline,
    attach_within,
    generate,
    logits,
    rel,
    seats_in,
    tiny_qwen3,
)

EXAMPLE = load_seat_catalog(EXAMPLES / "seats-qwen3.toml")


def test_attach_generate_detach_is_bit_identical(seats_home, caplog):
    model = tiny_qwen3()
    ids = torch.randint(0, 320, (2, 7), generator=torch.Generator().manual_seed(0))
    base = Baseline(model, ids)

    with caplog.at_level(logging.INFO, logger="frt.seats"):
        handle = attach(model, EXAMPLE, home=seats_home)
    # 2 layers x (4 norms + 7 projections + act_fn) + final norm + lm_head; 320 rows / 64 = 5 slabs.
    assert [r.getMessage() for r in caplog.records] == ["[frt.seats] 26 seats (5 head slabs), 0 refused"]
    assert handle.notes["refused"] == [] and handle.notes["unmatched"] == ["experts"]
    assert sorted(seats_in(model)) == sorted(r.site for r in handle.records)
    variants = {r.kernel.split()[0]: r.variant for r in handle.records}
    assert variants[LINEAR] == "torch-cpu" and variants[RMSNORM] == "torch-universal"  # this host's choice
    assert all(r.parity is not None and r.parity.error <= r.parity.bound for r in handle.records)

    assert rel(logits(model, ids), base.logits) < 1e-5
    assert torch.equal(generate(model, ids), base.tokens)
    s = handle.summary()
    assert s["seats"] == 26 and s["head_slabs"] == 5 and s["guarded_calls"] > 26
    assert s["fallbacks"] == 0 and s["seats_never_called"] == 0 and s["clean"]

    handle.detach()
    handle.detach()  # idempotent
    assert seats_in(model) == []
    base.assert_restored()
    assert handle.summary()["attached"] is False


def test_refusals_carry_reasons_and_the_rest_attach(seats_home):
    model = tiny_qwen3()
    cat = SeatCatalog(
        (
            SeatSpec("norm", KernelRef(WRONG, version=1, layer="RMSNorm"), match=("input_layernorm",)),
            SeatSpec(
                "linear",
                KernelRef(WRONG, version=1, function="linear_drops_bias"),
                match=("self_attn.q_proj", "mlp.down_proj"),
            ),
            SeatSpec("linear", KernelRef(LINEAR, version=2, layer="Linear"), match=("k_proj",)),
            SeatSpec("linear", KernelRef("kernels-test/seat-missing", version=1, layer="Linear"), match=("v_proj",)),
            SeatSpec(
                "norm",
                KernelRef(RMSNORM, version=1, layer="RMSNorm"),
                match=("post_attention_layernorm",),
                guards=Guards(dtypes=("bfloat16",)),
            ),
            SeatSpec("norm", KernelRef(RMSNORM, version=1, layer="Nope"), match=("model.norm",)),
        )
    )
    handle = attach(model, cat, home=seats_home)
    reasons = dict(handle.notes["refused"])
    # The wrong kernels: parity refuses them (the bias-dropping linear only where there is a bias).
    assert "parity: relative error" in reasons["model.layers.0.input_layernorm"]
    assert "parity: relative error" in reasons["model.layers.1.self_attn.q_proj"]
    assert sorted(r.site for r in handle.records) == ["model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"]
    # Resolvable upstream (v2 was scanned) but not staged: refused, nothing fetched.
    assert "resolves to" in reasons["model.layers.0.self_attn.k_proj"]
    assert "which is not staged under" in reasons["model.layers.0.self_attn.k_proj"]
    assert "not staged for this host" in reasons["model.layers.0.self_attn.v_proj"]
    assert "repository not found" in reasons["model.layers.0.self_attn.v_proj"]
    assert (
        reasons["model.layers.0.post_attention_layernorm"]
        == "guard mismatch: the module is float32, the seat admits bfloat16"
    )
    assert reasons["model.norm"] == "the kernel has no layers.Nope (it has: RMSNorm)"
    assert len(reasons) == 11 and handle.line() == "[frt.seats] 2 seats (0 head slabs), 11 refused"
    assert not handle.summary()["clean"]
    handle.detach()


def test_strict_raises_kernel_unavailable_and_attaches_nothing(seats_home):
    model = tiny_qwen3()
    cat = SeatCatalog(
        EXAMPLE.seats + (SeatSpec("norm", KernelRef(WRONG, version=1, layer="RMSNorm"), match=("model.norm",)),)
    )
    cat = SeatCatalog((cat.seats[-1],) + EXAMPLE.seats)  # the wrong norm wins model.norm
    with pytest.raises(SeatsRefused) as ei:
        attach(model, cat, home=seats_home, strict=True)
    assert isinstance(ei.value, KernelUnavailable)
    assert [site for site, _ in ei.value.refused] == ["model.norm"]
    assert "model.norm: parity: relative error" in str(ei.value)
    assert seats_in(model) == []


def test_an_error_midway_rolls_everything_back(seats_home):
    model = tiny_qwen3()
    before = dict(model.named_modules())
    mlp = model.model.layers[1].mlp

    def stubborn(self, name, value):
        if isinstance(value, Seat) and name == "down_proj":
            raise RuntimeError("this parent refuses a new child")
        torch.nn.Module.__setattr__(self, name, value)

    mlp.__class__ = type("StubbornMLP", (type(mlp),), {"__setattr__": stubborn})
    with pytest.raises(RuntimeError, match="refuses a new child"):
        attach(model, EXAMPLE, home=seats_home)
    assert seats_in(model) == [] and all(m is before[n] for n, m in model.named_modules())


def test_an_error_after_a_swap_leaves_no_seat_unrecorded(seats_home, monkeypatch):
    """A seat is recorded before its module is swapped in: an error between the two (here the record of the
    third seat) leaves nothing seated that detach would not undo (issue 50: the swap came first)."""
    attaching = importlib.import_module("frt.seats.attach")  # the module: frt.seats.attach names the function

    model = tiny_qwen3()
    before = dict(model.named_modules())
    made = []

    def record(*args, **kwargs):
        if len(made) == 2:
            raise MemoryError("no room for one more record")
        made.append(SeatRecord(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(attaching, "SeatRecord", record)  # the one fault a real attach cannot be made to meet
    with pytest.raises(MemoryError):
        attach(model, EXAMPLE, home=seats_home)
    assert seats_in(model) == [] and all(m is before[n] for n, m in model.named_modules())


def test_a_missed_guard_runs_the_original_and_is_counted(seats_home):
    model = tiny_qwen3()
    handle = attach(model, EXAMPLE, home=seats_home)
    seat = model.model.norm
    x = torch.randn(2, 3, 64, dtype=torch.float64)
    with torch.no_grad():
        assert torch.equal(seat(x), seat.original(x))  # float64 is outside the guard: the original ran
        seat(torch.randn(2, 3, 64))
    assert (seat.stats.calls, seat.stats.fallbacks) == (2, 1)
    s = handle.summary()
    assert s["fallbacks"] == 1 and s["seats_fell_back"] == 1 and not s["clean"]
    handle.detach()


def test_bfloat16_model_checks_parity_in_its_own_dtype(seats_home):
    model = tiny_qwen3().to(torch.bfloat16)
    ids = torch.randint(0, 320, (1, 6), generator=torch.Generator().manual_seed(1))
    handle = attach_within(model, ids, EXAMPLE, seats_home, seats=26, bound=3e-2)
    assert {r.parity.bound for r in handle.records} == {2e-2, 1e-4}  # the lm_head's tolerance overrides


def test_state_dict_keys_are_the_base_models_while_seated(seats_home):
    model = tiny_qwen3()
    keys = list(model.state_dict())
    handle = attach(model, EXAMPLE, home=seats_home)
    state = model.state_dict()
    assert sorted(state) == sorted(keys)
    model.load_state_dict(state)  # strict: the seat puts the "original." step back
    handle.detach()


def test_arch_rule_is_the_kernels_librarys():
    assert arch_problem(["8.0", "9.0"], (9, 0)) is None
    assert arch_problem(["8.0"], (8, 6)) is None  # same major, newer minor
    assert "9.0a" in arch_problem(["9.0a"], (10, 0))  # arch-specific: exact only
    assert arch_problem(["8.0+PTX"], (12, 0)) is None  # PTX: any newer device
    assert "CUDA capability 10.0" in arch_problem(["8.0", "9.0"], (10, 0))
    assert arch_problem([], (7, 5)) is None  # no archs declared: nothing to check


def test_rocm_arch_rule_is_exact_and_ignores_feature_flags():
    # No ROCm device here: the rule is checked on the gcnArchName strings torch reports there.
    assert rocm_arch_problem(["gfx90a", "gfx942"], "gfx942:sramecc+:xnack-") is None
    assert "ROCm arch gfx90a" in rocm_arch_problem(["gfx942"], "gfx90a:sramecc+:xnack-")
    assert "gfx1100" in rocm_arch_problem(["gfx1101"], "gfx1100")  # a neighbouring gfx is not enough
    assert rocm_arch_problem([], "gfx906") is None


def test_attach_needs_no_network(seats_home):
    """The staged kernels load in a network namespace with no route: nothing was left to fetch."""
    code = textwrap.dedent(f"""
        import torch
        from frt.manifests import KernelRef, SeatCatalog, SeatSpec
        from frt.seats import attach

        class Block(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.down_proj = torch.nn.Linear(16, 8)

        model = torch.nn.Sequential(Block()).eval()
        cat = SeatCatalog((SeatSpec("linear", KernelRef({LINEAR!r}, version=1, layer="Linear"),
                                    match=("down_proj",)),))
        h = attach(model, cat, home={str(seats_home)!r}, strict=True)
        print(h.line())
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "FRT_", "LOCAL_KERNELS"))}
    out = subprocess.run(
        ["unshare", "-n", sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[frt.seats] 1 seats (0 head slabs), 0 refused"


def test_a_pin_overrides_the_version_and_an_unstaged_pin_is_refused(seats_home):
    from frt.mirror.home_path import ledger_path
    from frt.resolver.ledger import Ledger
    from frt.resolver.resolve import resolve
    from frt.resolver.targets import host_target

    ledger = Ledger(ledger_path(seats_home))
    v1, v2 = (
        resolve(LINEAR, target=host_target(), ledger=ledger, version=v, offline=True, environ={}).commit for v in (1, 2)
    )
    ledger.close()
    pin = "FRT_KERNEL_REV_KERNELS_TEST_SEAT_LINEAR"
    model = torch.nn.Sequential(torch.nn.Linear(16, 8)).eval()

    def catalog(version):
        return SeatCatalog((SeatSpec("linear", KernelRef(LINEAR, version=version, layer="Linear"), match=("0",)),))

    handle = attach(model, catalog(2), home=seats_home, environ={pin: v1})  # v2 is not staged, the pinned v1 is
    assert [r.commit for r in handle.records] == [v1] and handle.notes["refused"] == []
    handle.detach()
    handle = attach(model, catalog(1), home=seats_home, environ={pin: v2})
    assert handle.records == [] and f"resolves to {v2[:12]}" in handle.notes["refused"][0][1]


def test_a_variant_for_another_backend_is_refused_before_any_cuda_query():
    from types import SimpleNamespace

    from frt.seats.checks import device_problem

    def kernel(variant, backend, archs=()):
        return SimpleNamespace(resolution=SimpleNamespace(variant=variant), backend_type=backend, archs=archs)

    assert (
        device_problem(kernel("torch-cpu", "cpu"), torch.device("cuda", 1))
        == "variant torch-cpu is built for cpu, the module is on cuda"
    )
    assert (
        device_problem(kernel("torch-cuda", "cuda", ("9.0",)), torch.device("cpu"))
        == "variant torch-cuda is built for cuda, the module is on cpu"
    )
    assert device_problem(kernel("torch-universal", "cpu"), torch.device("cpu")) is None
    assert device_problem(kernel("torch213-cxx11-cpu-x86_64-linux", "cpu"), torch.device("cpu")) is None


def test_hooks_on_a_seat_still_run(seats_home):
    """A seat skips nn.Module.__call__ only where that would just call forward: a hook of its own or a
    global one takes the full path."""
    model = tiny_qwen3()
    handle = attach(model, EXAMPLE, home=seats_home)
    seat, x, seen = model.model.norm, torch.randn(1, 3, 64), []
    h = seat.register_forward_hook(lambda m, i, o: seen.append(("own", o.shape)))
    with torch.no_grad():
        seat(x)
        h.remove()
        g = torch.nn.modules.module.register_module_forward_hook(
            lambda m, i, o: seen.append(("global", type(m).__name__)) if m is seat else None
        )
        seat(x)
        g.remove()
        seat(x)
    assert seen == [("own", torch.Size([1, 3, 64])), ("global", "Seat")]
    assert seat.stats.calls == 3 and seat.stats.fallbacks == 0
    handle.detach()


class FusedAddRMSNorm(torch.nn.Module):
    """The engines' RMSNorm contract (vLLM, SGLang): ``norm(x)`` is a tensor, ``norm(x, residual)`` is
    ``(norm(x + residual), x + residual)``, the sum taken in float32. Written here from vLLM's
    native op so the contract is tested in the main suite; the real vLLM module is seated in
    tests/engines/test_vllm_engine.py."""

    def __init__(self, width: int, eps: float = 1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(1 + 0.1 * torch.randn(width, generator=torch.Generator().manual_seed(5)))
        self.variance_epsilon = eps
        self.variance_size_override = None

    def forward(self, x, residual=None):
        orig = x.dtype
        x = x.float()
        if residual is not None:
            x = x + residual.float()
            residual = x.to(orig)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        out = (x.to(self.weight.dtype) * self.weight).to(orig)
        return out if residual is None else (out, residual)


def test_a_fused_add_norm_keeps_its_residual_contract(seats_home):
    model = torch.nn.Sequential()
    model.add_module("norm", FusedAddRMSNorm(64))
    model.eval()
    norm = model.norm
    cat = SeatCatalog((SeatSpec("norm", KernelRef(RMSNORM, version=1, function="rms_norm"), match=("norm",)),))
    handle = attach(model, cat, home=seats_home, strict=True)
    assert handle.records[0].parity.error < 1e-6  # the worse of the two probes: with and without residual
    x, r = torch.randn(3, 64), torch.randn(3, 64)
    with torch.no_grad():
        assert rel(model.norm(x), norm(x)) < 1e-6
        (out, res), (want_out, want_res) = model.norm(x, r), norm(x, r)
    assert rel(out, want_out) < 1e-6 and torch.equal(res, want_res)
    assert model.norm.stats.calls == 2 and model.norm.stats.fallbacks == 0
    handle.detach()

    # A layer with the one-argument forward does not fit the two-argument contract; a norm over part
    # of the row is refused outright.
    lay = SeatCatalog((SeatSpec("norm", KernelRef(RMSNORM, version=1, layer="RMSNorm"), match=("norm",)),))
    reasons = dict(attach(model, lay, home=seats_home).notes["refused"])
    assert (
        reasons["norm"] == "layers.RMSNorm.forward(hidden_states) does not match FusedAddRMSNorm.forward(x, residual)"
    )
    norm.variance_size_override = 32
    reasons = dict(attach(model, cat, home=seats_home).notes["refused"])
    assert reasons["norm"] == "FusedAddRMSNorm normalises over variance_size_override channels, not the whole row"
