"""Targets and variant choice: ours must equal the `kernels` library's own, for this host and any target."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kernels.variants import parse_variant, resolve_variants

from frt.resolver.errors import BadInput
from frt.resolver.targets import host_target, known_backend, parse_target
from frt.resolver.variants import accepted, decide

# ≥ 30 names: arch (torch, cxx11/cxx98), stable-ABI, tvm-ffi, noarch, universal, other CUDA/ROCm/XPU,
# other torch minors, other cpu/os.
CORPUS = [
    "torch213-cxx11-cpu-x86_64-linux",
    "torch213-cpu-x86_64-linux",
    "torch213-cxx98-cpu-x86_64-linux",
    "torch212-cxx11-cpu-x86_64-linux",
    "torch211-cxx11-cpu-x86_64-linux",
    "torch210-cxx11-cpu-x86_64-linux",
    "torch213-cxx11-cpu-aarch64-linux",
    "torch212-cxx11-cpu-aarch64-linux",
    "torch213-cpu-aarch64-darwin",
    "torch213-metal-aarch64-darwin",
    "torch213-cxx11-cu126-x86_64-linux",
    "torch213-cxx11-cu128-x86_64-linux",
    "torch213-cxx11-cu130-x86_64-linux",
    "torch213-cxx11-cu132-x86_64-linux",
    "torch211-cxx11-cu130-x86_64-linux",
    "torch211-cxx11-cu130-aarch64-linux",
    "torch212-cxx11-cu126-aarch64-linux",
    "torch213-cxx11-rocm71-x86_64-linux",
    "torch213-cxx11-rocm72-x86_64-linux",
    "torch213-cxx11-xpu20253-x86_64-linux",
    "torch213-cxx11-xpu20260-x86_64-linux",
    "torch-stable-abi211-cpu-x86_64-linux",
    "torch-stable-abi213-cpu-x86_64-linux",
    "torch-stable-abi214-cpu-x86_64-linux",
    "torch-stable-abi211-cu128-x86_64-linux",
    "torch-stable-abi212-cu130-aarch64-linux",
    "tvm-ffi01-cu128-x86_64-linux",
    "tvm-ffi01-cpu-x86_64-linux",
    "torch-cpu",
    "torch-cuda",
    "torch-rocm",
    "torch-xpu",
    "torch-metal",
    "torch-npu",
    "torch-universal",
    "torch213-cxx11-cpu-x86_64-windows",
]


def library_choice(names: list[str]) -> list[str]:
    """What `kernels` itself accepts on this machine, in its preference order."""
    chosen, _ = resolve_variants([parse_variant(n) for n in names])
    return [v.variant_str for v in chosen]


def test_corpus_is_large_and_parseable():
    assert len(set(CORPUS)) >= 30
    for name in CORPUS:
        assert parse_variant(name).variant_str == name


def test_host_choice_equals_the_library_with_torch():
    target = host_target()
    assert target.torch is not None, "the test environment installs torch so host detection sees it"
    ours = accepted(target, CORPUS)
    assert ours == library_choice(CORPUS)
    assert ours, "this host must accept some of the corpus"
    # The explicit spelling of this host is the same target.
    assert accepted(parse_target(str(target)), CORPUS) == ours


def test_host_choice_equals_the_library_without_torch():
    """On a box with no torch (a stager), both must fall back to noarch variants only."""
    code = textwrap.dedent(f"""
        import sys, importlib.abc
        class NoTorch(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ModuleNotFoundError(name)
        sys.meta_path.insert(0, NoTorch())
        import importlib.util
        _orig = importlib.util.find_spec
        importlib.util.find_spec = lambda n, *a: None if n == "torch" else _orig(n, *a)
        from kernels.variants import parse_variant, resolve_variants
        from frt.resolver.targets import host_target
        from frt.resolver.variants import accepted
        corpus = {CORPUS!r}
        lib = [v.variant_str for v in resolve_variants([parse_variant(n) for n in corpus])[0]]
        ours = accepted(host_target(), corpus)
        assert "torch" not in sys.modules, "resolver imported torch"
        assert ours == lib, (ours, lib)
        print(ours)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "torch-universal" in out.stdout


def test_foreign_target_is_refused_in_the_library_wording():
    arm = parse_target("torch2.13-cpu-aarch64-linux")
    reasons = {d.name: d.reason for d in decide(arm, CORPUS) if not d.accepted}
    assert reasons["torch213-cxx11-cpu-x86_64-linux"] == "CPU (x86_64) does not match system CPU (aarch64)"
    assert reasons["torch212-cxx11-cpu-aarch64-linux"] == (
        "Torch version (2.12) does not match environment Torch version (2.13)"
    )
    assert accepted(arm, CORPUS)[0] == "torch213-cxx11-cpu-aarch64-linux"


def test_cuda_minor_rule_and_preference_for_a_cuda_target():
    t = parse_target("torch2.13-cu130-x86_64-linux")
    got = accepted(t, CORPUS)
    # stable-ABI first (none for cu13 x86_64 here), then torch213 by highest compatible CUDA minor,
    # then the CUDA noarch, then universal. cu132 is too new, cu12x is another major.
    assert got == ["torch213-cxx11-cu130-x86_64-linux", "torch-cuda", "torch-universal"]
    reasons = {d.name: d.reason for d in decide(t, CORPUS)}
    assert "not compatible with system CUDA version (13.0)" in reasons["torch213-cxx11-cu132-x86_64-linux"]
    assert "not compatible" in reasons["torch213-cxx11-cu126-x86_64-linux"]


def test_universal_is_accepted_by_every_target():
    for t in [
        "torch2.11-cu130-aarch64-linux",
        "torch2.13-rocm71-x86_64-linux",
        "torch2.10-xpu20253-x86_64-linux",
        "torch2.13-metal-aarch64-darwin",
        "torch2.13-cpu-x86_64-windows",
    ]:
        assert accepted(parse_target(t), ["torch-universal"]) == ["torch-universal"], t


def test_unparseable_variant_names_are_rejected_not_fatal():
    decisions = decide(parse_target("torch2.13-cpu-x86_64-linux"), ["garbage-dir", "torch-cpu"])
    assert [(d.name, d.accepted) for d in decisions] == [("torch-cpu", True), ("garbage-dir", False)]


@pytest.mark.parametrize(
    "text",
    [
        "torch2.11-cu130-aarch64",
        "torch211-cu130-x86_64-linux",
        "2.11-cpu-x86_64-linux",
        "torch2.11-cuda-x86_64-linux",
        "torch2.11-cpu-x86_64-Linux",
        "",
        "hosts",
    ],
)
def test_bad_targets_are_bad_input(text):
    with pytest.raises(BadInput, match="target|backend|cpu|os"):
        parse_target(text)


def test_target_fields_and_string_round_trip():
    t = parse_target("torch2.11-cu130-aarch64-linux")
    assert (str(t.torch), t.backend, t.cpu, t.os, t.cxx11_abi) == ("2.11", "cu130", "aarch64", "linux", True)
    assert str(t) == "torch2.11-cu130-aarch64-linux"
    assert parse_target("torch2.6-cpu-x86_64-linux").cxx11_abi is False  # pre-2.7 wheels were cxx98
    assert parse_target("torch2.13-metal-aarch64-darwin").cxx11_abi is None


def _kernels_takes(backend: str) -> bool:
    """kernels' own parser, with the one rule frt adds (CUDA 11 or later)."""
    from kernels.backends import parse_backend

    try:
        parsed = parse_backend(backend)
    except ValueError:
        return False
    return parsed.name != "cuda" or parsed.version.major >= 11


_TOKENS = st.one_of(
    st.sampled_from(["cpu", "metal", "neuron", "tpu", "cuda", "rocm", "cu", "xpu", "cann", "npu", "mps", "CPU"]),
    st.builds(
        "".join,
        st.lists(
            st.one_of(
                st.sampled_from(
                    ["cu", "rocm", "xpu", "cann", "cpu", "0", "1", "9", "٣", "²", "-", "_", " ", "\n", "a"]
                ),
                st.text(alphabet=st.characters(codec="utf-8"), max_size=2),
            ),
            max_size=6,
        ),
    ),
)


@settings(max_examples=3000, deadline=None)
@given(_TOKENS)
def test_a_backend_is_known_exactly_where_kernels_parses_it(backend):
    """targets.known_backend checks a backend without importing kernels (which a job's `env` would pay
    on every start): it must take exactly what kernels' parse_backend takes."""
    assert known_backend(backend) == _kernels_takes(backend), backend


@pytest.mark.parametrize(
    "backend", ["cu118", "cu130", "cu0118", "cu1299", "rocm71", "xpu20253", "cann81", "cu13", "cu9"]
)
def test_known_backends_beside_kernels(backend):
    assert known_backend(backend) == _kernels_takes(backend)
