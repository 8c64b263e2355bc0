"""A compiled CPU arch variant: built with torch.utils.cpp_extension, cached, staged, resolved, seated.

`seat-compiled` (tests/support/seat_fixtures_compiled.py) holds this host's arch variant (a real .so) and a
pure-torch torch-universal fallback. It is staged for this host with the real `frt-mirror stage` from a
fake Hub; the resolver must prefer the arch variant, and the seats must run the staged .so in a tiny
Qwen3 with parity, identical generation, and a bit-identical detach. The build cache must be hit on a
second call and must not trust a .so that changed after it was built.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from frt.manifests import Guards, KernelRef, SeatCatalog, SeatSpec  # noqa: E402
from frt.mirror.home_path import ledger_path  # noqa: E402
from frt.resolver.ledger import Ledger
from frt.resolver.resolve import resolve
from frt.resolver.targets import host_target
from frt.resolver.variants import decide
from frt.seats import attach  # noqa: E402
from tests.support import ROOT  # noqa: E402
from tests.support.seat_fixtures import Baseline, attach_within, generate, logits, rel, seats_in, tiny_qwen3  # noqa: E402
from tests.support.seat_fixtures_compiled import (  # noqa: E402
    COMPILED,
    BuildUnavailable,
    CompiledBuild,
    build_compiled,
    entry_problem,
    host_variant,
    staged_compiled_home,
)

CATALOG = SeatCatalog(
    (
        SeatSpec(
            "norm",
            KernelRef(COMPILED, version=1, layer="RMSNorm"),
            match_class=("Qwen3RMSNorm",),
            guards=Guards(dtypes=("float32", "bfloat16", "float16")),
        ),
        SeatSpec("activation", KernelRef(COMPILED, version=1, function="silu"), match=("mlp.act_fn",)),
    )
)
# 2 layers x (input, post-attention, q and k norms) + the final norm; 2 act_fn.
SEATS = 2 * 4 + 1 + 2


@pytest.fixture(scope="session")
def compiled_build() -> CompiledBuild:
    try:
        build = build_compiled()
    except BuildUnavailable as e:
        pytest.skip(f"cannot build the C++ fixture kernel here: {e}")
    print(
        f"\n[seat-compiled] first build call: {'cache hit' if build.cache_hit else 'compiled'} in "
        f"{build.seconds:.3f}s (the entry's compile took {build.build_seconds:.1f}s)"
    )
    return build


@pytest.fixture(scope="session")
def compiled_home(tmp_path_factory, compiled_build) -> Path:
    return staged_compiled_home(tmp_path_factory.mktemp("compiled"), compiled_build)


def compiled_module(build: CompiledBuild):
    """The staged arch variant as the kernels loader imported it (under its metadata id)."""
    return sys.modules[f"_seat_compiled_{build.key[:12]}_{host_variant().replace('-', '_')}"]


def test_the_resolver_prefers_the_compiled_arch_variant_on_this_host(compiled_home):
    from kernels.variants import parse_variant, resolve_variant

    ledger = Ledger(ledger_path(compiled_home))
    try:
        res = resolve(COMPILED, target=host_target(), ledger=ledger, version=1, offline=True, environ={})
    finally:
        ledger.close()
    assert res.variant == host_variant() != "torch-universal"
    names = [host_variant(), "torch-universal"]
    trace = decide(host_target(), names)
    assert [(d.name, d.accepted) for d in trace] == [(host_variant(), True), ("torch-universal", True)]
    # The kernels library, asked about this very machine, picks the same build.
    chosen, _ = resolve_variant([parse_variant(n) for n in names], backend="cpu")
    assert chosen is not None and chosen.variant_str == res.variant


def test_compiled_seats_in_qwen3_generate_like_the_base_and_detach_exactly(compiled_home, compiled_build):
    model = tiny_qwen3()
    ids = torch.randint(0, 320, (2, 7), generator=torch.Generator().manual_seed(0))
    base = Baseline(model, ids, n=6)

    handle = attach(model, CATALOG, home=compiled_home)
    assert handle.notes["refused"] == [] and len(handle.records) == SEATS
    assert {r.variant for r in handle.records} == {host_variant()}
    assert all(r.parity is not None and r.parity.error <= r.parity.bound for r in handle.records)
    # The ops ran from the staged .so (the test process never loads the cached one: it is built in a child).
    kernel = compiled_module(compiled_build)
    assert kernel.NAMESPACE == compiled_build.namespace
    assert kernel.LIBRARY.parent.name == host_variant() and kernel.LIBRARY.is_relative_to(compiled_home)
    assert str(kernel.LIBRARY) in torch.ops.loaded_libraries

    assert rel(logits(model, ids), base.logits) < 1e-5
    assert torch.equal(generate(model, ids, n=6), base.tokens)
    s = handle.summary()
    assert s["fallbacks"] == 0 and s["seats_never_called"] == 0 and s["clean"]

    handle.detach()
    assert seats_in(model) == []
    base.assert_restored()


def test_compiled_seats_in_a_bfloat16_qwen3(compiled_home):
    model = tiny_qwen3().to(torch.bfloat16)
    ids = torch.randint(0, 320, (1, 6), generator=torch.Generator().manual_seed(1))
    handle = attach_within(model, ids, CATALOG, compiled_home, seats=SEATS, bound=3e-2)
    assert {r.parity.bound for r in handle.records} == {2e-2}


@pytest.mark.parametrize("dtype, bound", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2), (torch.float16, 2e-3)])
def test_the_compiled_ops_match_transformers_rmsnorm_and_silu(compiled_home, compiled_build, dtype, bound):
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    model = tiny_qwen3()  # a seat on a throwaway model loads the staged kernel through the real path
    handle = attach(model, CATALOG, home=compiled_home)
    kernel = compiled_module(compiled_build)
    handle.detach()

    gen = torch.Generator().manual_seed(7)
    norm = Qwen3RMSNorm(96, eps=1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(96, generator=gen))
        x = torch.randn(3, 96, 5, generator=gen).to(dtype).transpose(1, 2)  # not contiguous
        got, want = kernel.rms_norm(x, norm.weight, norm.variance_epsilon), norm(x)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert rel(got, want) < bound
        # Mixed dtypes promote as the module would.
        w32 = norm.weight.float()
        assert kernel.rms_norm(x, w32, 1e-6).dtype == (w32 * x).dtype
        y = torch.randn(4, 33, generator=gen).to(dtype)
        assert rel(kernel.silu(y), torch.nn.functional.silu(y)) < bound


def test_a_second_staged_copy_in_the_same_process_reuses_the_registered_ops(compiled_home, compiled_build, tmp_path):
    """Two homes with the same build: TORCH_LIBRARY would refuse a second registration of the namespace,
    so the second copy's package finds the ops registered (by the identical code) and uses them."""
    model = tiny_qwen3()
    attach(model, CATALOG, home=compiled_home).detach()  # the first copy is loaded, whichever test ran first
    other = staged_compiled_home(tmp_path, compiled_build)
    ids = torch.randint(0, 320, (1, 5), generator=torch.Generator().manual_seed(2))
    base = logits(model, ids)
    handle = attach(model, CATALOG, home=other)
    assert handle.notes["refused"] == [] and len(handle.records) == SEATS
    second = compiled_module(compiled_build)  # the loader registered the new copy under the same id
    assert second.LIBRARY.is_relative_to(other) and str(second.LIBRARY) not in torch.ops.loaded_libraries
    assert rel(logits(model, ids), base) < 1e-5
    handle.detach()


def test_a_second_build_call_hits_the_cache(compiled_build):
    before = compiled_build.library.stat()
    again = build_compiled()
    print(
        f"\n[seat-compiled] second build call: cache hit in {again.seconds * 1000:.1f} ms "
        f"(the entry's compile took {again.build_seconds:.1f}s)"
    )
    assert again.cache_hit and again.rebuilt_because is None
    after = again.library.stat()
    assert again.library == compiled_build.library and again.sha256 == compiled_build.sha256
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


@pytest.mark.slow  # one real compile, ~20-30 s on a 2-core box
def test_a_tampered_cached_library_is_rebuilt_not_used(compiled_build, tmp_path):
    """A copy of the real entry, its .so corrupted: the hash check refuses it and two concurrent
    builders (separate processes) rebuild it exactly once, each getting a sound entry."""
    root = tmp_path / "cache"
    entry = root / "seat-compiled" / compiled_build.key
    shutil.copytree(compiled_build.library.parent, entry)
    lib = entry / compiled_build.library.name
    data = bytearray(lib.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte: same size, same mtime granularity, wrong hash
    lib.write_bytes(bytes(data))
    assert "has sha256" in entry_problem(entry, compiled_build.key)

    code = textwrap.dedent(f"""
        import json, sys
        from pathlib import Path
        from tests.support.seat_fixtures_compiled import build_compiled
        b = build_compiled(Path({str(root)!r}))
        print(json.dumps({{"hit": b.cache_hit, "because": b.rebuilt_because, "sha256": b.sha256,
                          "seconds": b.seconds}}))
    """)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=900)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    print(f"\n[seat-compiled] tampered entry: rebuilt in {max(r['seconds'] for r in results):.1f}s")
    rebuilt = [r for r in results if not r["hit"]]
    assert len(rebuilt) == 1 and "has sha256" in rebuilt[0]["because"]
    assert [r["hit"] for r in results].count(True) == 1  # the other waited on the lock, then trusted it
    assert entry_problem(entry, compiled_build.key) is None
    assert lib.read_bytes() != bytes(data) and {r["sha256"] for r in results} == {
        json.loads((entry / "build.json").read_text())["sha256"]
    }
    assert sorted(p.name for p in entry.iterdir()) == sorted(["build.json", "kernel.cpp", lib.name])
    assert [p.name for p in entry.parent.iterdir() if p.name.startswith(".")] == []  # no temp dirs left
