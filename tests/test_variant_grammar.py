"""kernels' whole variant grammar, exactly: our choice against kernels 0.17.2's own resolver, both ways round.

Generated variant sets (every kind kernels parses: torchXY[-cxx11|-cxx98], torch-stable-abiXY, tvm-ffiXY over
cu/rocm/xpu/cann/metal/neuron/tpu/cpu backends, the noarch torch-<backend> and torch-universal) are judged
for generated systems twice over:

- from our side: a target string, ours by `accepted(parse_target(...))`; kernels' by its host path,
  `kernels.variants.resolve_variants`, on this interpreter with the system faked to be that target (torch's
  version, ABI and build, the platform) the way kernels' own tests fake a device;
- from kernels' side: a faked system as kernels detects one (any torch build, ABI, macOS release, tvm-ffi
  installed or not), ours by `accepted(host_target())` detected under the same fake.

Each compares the accepted lists in order (so neither accepts what the other rejects) and the rejection
reasons. 300 examples × 20 systems each way, and 120 × 12 arch targets: 13,440 cases a run, each test
asserting its own count. Arch targets add generated metadata.json `backend` declarations: ours keeps, in
kernels' order, the builds that kernels' own load-time check (`kernels.archs._check_arch_incompatibility`, run
with each of the target's devices faked) lets load on every named arch.
"""

from __future__ import annotations

import json
import platform
import sys
import types
from contextlib import ExitStack
from unittest import mock

import kernels.compat
import kernels.variants
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kernels._rust import Metadata
from kernels.archs import _check_arch_incompatibility
from kernels.variants import VariantAccepted, parse_variant, resolve_variants

from frt.resolver.archs import Declared
from frt.resolver.targets import host_target, parse_target
from frt.resolver.variants import accepted, decide

TORCH_MINORS = range(5, 15)  # 2.5 .. 2.14: cxx98 wheels before 2.7, cxx11 after
CPUS, OSES = ("x86_64", "aarch64"), ("linux", "darwin", "windows")


def _backends():
    """Backend tokens as variants and targets spell them, over a few versions each so they collide."""
    return st.one_of(
        st.sampled_from(["cpu", "metal", "neuron", "tpu"]),
        st.builds("cu{}{}".format, st.sampled_from([12, 13]), st.integers(0, 9)),
        st.builds("rocm{}{}".format, st.sampled_from([6, 7]), st.integers(0, 4)),
        st.builds("xpu{}{}".format, st.sampled_from([2025, 2026]), st.integers(0, 3)),
        st.builds("cann{}{}".format, st.sampled_from([7, 8]), st.integers(0, 3)),
    )


def _arch_variant():
    framework = st.one_of(
        st.builds("torch2{}{}".format, st.sampled_from(TORCH_MINORS), st.sampled_from(["", "-cxx11", "-cxx98"])),
        st.builds("torch-stable-abi2{}".format, st.sampled_from(TORCH_MINORS)),
        st.builds("tvm-ffi0{}".format, st.integers(1, 3)),
    )
    return st.builds("{}-{}-{}-{}".format, framework, _backends(), st.sampled_from(CPUS), st.sampled_from(OSES))


NOARCH_NAMES = [
    "torch-cpu",
    "torch-cuda",
    "torch-rocm",
    "torch-xpu",
    "torch-npu",
    "torch-metal",
    "torch-neuron",
    "torch-tpu",
    "torch-universal",
]
VARIANT_SETS = st.lists(st.one_of(_arch_variant(), st.sampled_from(NOARCH_NAMES)), min_size=1, max_size=14, unique=True)


# -- faking a system the way kernels' tests do ---------------------------------------------------------


class _CannInfo(types.ModuleType):
    def __init__(self, version: str):
        super().__init__("torch_npu.utils.collect_env")
        self.get_cann_version = lambda: version


def fake_system(
    stack: ExitStack,
    *,
    machine: str,
    system: str,
    torch_version: str,
    cxx11: bool,
    device: tuple,
    mac: str = "",
    tvm_ffi: str | None = None,
) -> None:
    """Make this interpreter the system kernels would detect: `device` is ("cuda", "13.0"), ("rocm", hip),
    ("xpu", "20250300"), ("cann", "8.1.RC1"), ("metal",), ("neuron",), ("tpu",) or ("cpu",)."""
    p = stack.enter_context
    p(mock.patch.object(platform, "machine", lambda: machine))
    p(mock.patch.object(platform, "system", lambda: system))
    p(mock.patch.object(platform, "mac_ver", lambda: (mac, ("", "", ""), "")))
    p(mock.patch.object(torch, "__version__", torch_version))
    p(mock.patch.object(torch, "compiled_with_cxx11_abi", lambda: cxx11))
    kind = device[0]
    p(mock.patch.object(torch.version, "cuda", device[1] if kind == "cuda" else None))
    p(mock.patch.object(torch.version, "hip", device[1] if kind == "rocm" else None))
    p(mock.patch.object(torch.version, "xpu", device[1] if kind == "xpu" else None, create=True))
    p(mock.patch.object(torch.backends.mps, "is_available", lambda: kind == "metal"))
    if kind == "neuron":
        p(mock.patch.object(torch, "neuron", object(), create=True))
    if kind == "tpu":
        p(mock.patch.object(torch.backends, "tpu", object(), create=True))
    if kind == "cann":
        p(mock.patch.object(torch._C, "_get_privateuse1_backend_name", lambda: "npu"))
        p(
            mock.patch.dict(
                sys.modules,
                {
                    "torch_npu": types.ModuleType("torch_npu"),
                    "torch_npu.utils": types.ModuleType("torch_npu.utils"),
                    "torch_npu.utils.collect_env": _CannInfo(device[1]),
                },
            )
        )
    for module in (kernels.compat, kernels.variants):
        p(mock.patch.object(module, "has_tvm_ffi", tvm_ffi is not None))
    if tvm_ffi is not None:
        p(mock.patch.dict(sys.modules, {"tvm_ffi": types.SimpleNamespace(__version__=tvm_ffi)}))


def device_of(backend: str) -> tuple:
    """The torch build a target's backend token stands for, as torch reports it."""
    for prefix, kind, spell in (
        ("cu", "cuda", lambda M, m: f"{M}.{m}"),
        ("rocm", "rocm", lambda M, m: f"{M}.{m}.4-ab"),
        ("xpu", "xpu", lambda Y, n: f"{Y}0{n}00"),
        ("cann", "cann", lambda M, m: f"{M}.{m}.RC1"),
    ):
        if backend.startswith(prefix):
            digits = backend[len(prefix) :]
            return kind, spell(digits[:-1], digits[-1])
    return (backend,)


def kernels_choice(names: list[str]) -> tuple[list[str], dict[str, str]]:
    """kernels' own host resolution of these names on the (faked) system: accepted in order, and reasons.

    The names go in sorted. kernels' sort is stable and some builds tie under its key (a tvm-ffi build
    and the noarch build of one backend, e.g. `tvm-ffi01-rocm70-…` and `torch-rocm`), so its order
    among them is its input's; and its input is a `set` of the tree's folder names
    (`kernels.variants.get_variants`), so kernels itself breaks such ties by string hash, differently
    in each process. We break them by name; `test_kernels_breaks_ties_by_its_input_order` shows it.
    """
    chosen, trace = resolve_variants([parse_variant(n) for n in sorted(names)])
    return [v.variant_str for v in chosen], {
        d.variant.variant_str: d.reason for d in trace if not isinstance(d, VariantAccepted)
    }


def our_choice(target, names, declared=None) -> tuple[list[str], dict[str, str]]:
    decisions = decide(target, names, declared)
    return [d.name for d in decisions if d.accepted], {d.name: d.reason for d in decisions if not d.accepted}


# -- from our side: target strings ----------------------------------------------------------------------

TARGETS = st.builds(
    lambda minor, backend, cpu, os: f"torch2.{minor}-{backend}-{cpu}-{os}",
    st.sampled_from(TORCH_MINORS),
    _backends(),
    st.sampled_from(CPUS),
    st.sampled_from(OSES),
)


def faked_as(stack: ExitStack, target) -> None:
    """The system a named target describes, as kernels would find it on such a machine."""
    machine = {("darwin", "aarch64"): "arm64", ("windows", "x86_64"): "AMD64"}.get((target.os, target.cpu), target.cpu)
    fake_system(
        stack,
        machine=machine,
        system=target.os.capitalize(),
        torch_version=f"{target.torch}.1+frt",
        cxx11=bool(target.cxx11_abi),
        device=device_of(target.backend),
        mac="26.0" if target.os == "darwin" else "",
    )


def test_named_targets_choose_what_kernels_chooses_on_such_a_system():
    cases = []

    @settings(max_examples=300, deadline=None)
    @given(names=VARIANT_SETS, targets=st.lists(TARGETS, min_size=20, max_size=20))
    def check(names, targets):
        for text in targets:
            target = parse_target(text)
            with ExitStack() as stack:
                faked_as(stack, target)
                theirs = kernels_choice(names)
            assert our_choice(target, names) == theirs, text
            cases.append(1)

    check()
    assert len(cases) >= 6_000


# -- from kernels' side: faked systems ------------------------------------------------------------------

DEVICES = st.one_of(
    st.just(("cpu",)),
    st.just(("metal",)),
    st.just(("neuron",)),
    st.just(("tpu",)),
    st.builds(lambda M, m: ("cuda", f"{M}.{m}"), st.sampled_from([12, 13]), st.integers(0, 9)),
    st.builds(lambda M, m: ("rocm", f"{M}.{m}.{m}0321-0f2d6"), st.sampled_from([6, 7]), st.integers(0, 4)),
    st.builds(lambda Y, n: ("xpu", f"{Y}0{n}00"), st.sampled_from([2025, 2026]), st.integers(0, 3)),
    st.builds(lambda M, m: ("cann", f"{M}.{m}.RC1"), st.sampled_from([7, 8]), st.integers(0, 3)),
)
SYSTEMS = st.fixed_dictionaries(
    {
        "machine": st.sampled_from(["x86_64", "aarch64", "arm64", "AMD64"]),
        "system": st.sampled_from(["Linux", "Darwin", "Windows"]),
        "torch_version": st.builds(
            "2.{}.{}{}".format,
            st.sampled_from(TORCH_MINORS),
            st.integers(0, 2),
            st.sampled_from(["", "+cu130", "+cpu", ".dev20260101"]),
        ),
        "cxx11": st.booleans(),  # not only the official wheels' ABI: a source build may differ
        "device": DEVICES,
        "mac": st.sampled_from(["", "15.5", "26.0", "26.2"]),
        "tvm_ffi": st.sampled_from([None, "0.1.4", "0.2.0", "0.3.1"]),
    }
)


def test_host_detection_chooses_what_kernels_chooses_on_any_system():
    cases = []

    @settings(max_examples=300, deadline=None)
    @given(names=VARIANT_SETS, systems=st.lists(SYSTEMS, min_size=20, max_size=20))
    def check(names, systems):
        for system in systems:
            with ExitStack() as stack:
                fake_system(stack, **system)
                theirs = kernels_choice(names)
                ours = our_choice(host_target(), names)
            assert ours == theirs, system
            cases.append(1)

    check()
    assert len(cases) >= 6_000


# -- GPU archs: kernels' load-time check, with each of the target's devices faked -------------------------

CUDA_DECLARED = [
    "7.5",
    "8.0",
    "8.6",
    "8.9",
    "9.0",
    "9.0a",
    "10.0",
    "10.0a",
    "10.0f",
    "12.0f",
    "9.0+PTX",
    "8.0+PTX",
    "9.0a+PTX",
    "10.0f+PTX",
    "garbage",
    "11",
]
ROCM_DECLARED = ["gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1151", "sm_80"]
DECLARED = st.one_of(
    st.none(),
    st.builds(
        lambda kind, archs: (kind, archs),
        st.sampled_from(["cuda", "rocm", "cpu", "xpu", "metal"]),
        st.one_of(st.none(), st.lists(st.sampled_from(CUDA_DECLARED + ROCM_DECLARED), max_size=4, unique=True)),
    ),
)
CUDA_DEVICES = ["7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "10.3", "12.0", "12.1"]
ROCM_DEVICES = ["gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1151"]
ARCH_TARGETS = st.one_of(
    st.builds(
        lambda minor, cu, archs: f"torch2.{minor}-{cu}-x86_64-linux@{','.join(archs)}",
        st.sampled_from([12, 13]),
        st.sampled_from(["cu126", "cu128", "cu130"]),
        st.lists(st.sampled_from(CUDA_DEVICES), min_size=1, max_size=3, unique=True),
    ),
    st.builds(
        lambda minor, rocm, archs: f"torch2.{minor}-{rocm}-x86_64-linux@{','.join(archs)}",
        st.sampled_from([12, 13]),
        st.sampled_from(["rocm71", "rocm72"]),
        st.lists(st.sampled_from(ROCM_DEVICES), min_size=1, max_size=3, unique=True),
    ),
)
GPU_VARIANTS = st.lists(
    st.one_of(
        st.builds(
            "torch2{}-cxx11-{}-x86_64-linux".format,
            st.sampled_from([12, 13]),
            st.sampled_from(["cu126", "cu128", "cu130", "rocm71", "rocm72"]),
        ),
        st.builds(
            "torch-stable-abi2{}-{}-x86_64-linux".format,
            st.sampled_from([11, 12]),
            st.sampled_from(["cu128", "cu130", "rocm71"]),
        ),
        st.sampled_from(["torch-cuda", "torch-rocm", "torch-universal", "torch-cpu"]),
    ),
    min_size=1,
    max_size=8,
    unique=True,
)


def metadata_doc(declared) -> dict | None:
    if declared is None:
        return None  # a build without metadata.json: nothing declared
    kind, archs = declared
    return {
        "id": "_k_0",
        "name": "fleet-kernel",
        "version": 1,
        "license": "mit",
        "python-depends": [],
        "backend": {"type": kind, **({"archs": archs} if archs is not None else {})},
    }


def loads_on(doc: dict | None, variant: str, device: str, arch: str) -> bool:
    """kernels' own load-time arch check, on one faked device (as in kernels' tests/test_archs.py)."""
    if doc is None:
        return True
    meta = Metadata.from_bytes(json.dumps(doc).encode())
    with ExitStack() as stack:
        p = stack.enter_context
        p(mock.patch.object(torch.cuda, "is_available", lambda: True))
        if device == "cuda":
            p(mock.patch.object(torch.version, "cuda", "13.0"))
            p(mock.patch.object(torch.version, "hip", None))
            major, minor = (int(x) for x in arch.split("."))
            p(mock.patch.object(torch.cuda, "get_device_capability", lambda device=None: (major, minor)))
        else:
            props = types.SimpleNamespace(gcnArchName=f"{arch}:sramecc+:xnack-")
            p(mock.patch.object(torch.version, "cuda", None))
            p(mock.patch.object(torch.version, "hip", "7.1.0"))
            p(mock.patch.object(torch.cuda, "current_device", lambda: 0))
            p(mock.patch.object(torch.cuda, "get_device_properties", lambda device: props))
        try:
            _check_arch_incompatibility(meta, variant)
        except RuntimeError:
            return False
    return True


def test_arch_targets_keep_what_kernels_loads_on_every_arch_in_its_order():
    cases = []

    @settings(max_examples=120, deadline=None)
    @given(
        names=GPU_VARIANTS,
        declared=st.lists(DECLARED, min_size=8, max_size=8),
        targets=st.lists(ARCH_TARGETS, min_size=12, max_size=12),
    )
    def check(names, declared, targets):
        docs = dict(zip(names, (metadata_doc(d) for d in declared), strict=False))
        ours_declared = {n: Declared.of(doc) for n, doc in docs.items()}
        for text in targets:
            target = parse_target(text)
            with ExitStack() as stack:
                faked_as(stack, target.by_name)
                by_name, _ = kernels_choice(names)
            theirs = [v for v in by_name if all(loads_on(docs[v], v, target.device, a) for a in target.archs)]
            assert accepted(target, names, ours_declared) == theirs, (text, docs)
            cases.append(1)

    check()
    assert len(cases) >= 1_440


def test_kernels_breaks_ties_by_its_input_order():
    """Why `kernels_choice` sorts: the same two builds, two input orders, two different kernels picks."""
    names = ["tvm-ffi01-cpu-x86_64-linux", "torch-cpu"]
    with ExitStack() as stack:
        fake_system(
            stack, machine="x86_64", system="Linux", torch_version="2.9.0", cxx11=True, device=("cpu",), tvm_ffi="0.1.4"
        )
        picks = {
            resolve_variants([parse_variant(n) for n in order])[0][0].variant_str for order in (names, names[::-1])
        }
        ours = [accepted(host_target(), order) for order in (names, names[::-1])]
    assert picks == set(names)
    assert ours == [sorted(names)] * 2
