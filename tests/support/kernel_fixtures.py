"""Fixture kernel repos in the Hub layout, built by the tests (and by `make demo`).

Every variant holds a real, importable kernel (pure Python, torch imported lazily)
and a `metadata.json` that `kernels` 0.17 accepts. Arch variants for other
machines (aarch64, other CUDA) exist to be resolved and staged, not loaded here.

`kernels-test/activation` carries the aarch64 trap: older v1 commits lack the
aarch64 variants, a middle one adds them, and the v1 head (a rebuild) dropped the
CUDA one again; v2 has everything. `kernels-test/relu` has a torch-universal build
in every commit, so no target is ever refused for it.
"""

from __future__ import annotations

import base64
import hashlib
import json

from tests.support.fakehub import FakeRepo

ORG = "kernels-test"
X86_CPU = "torch213-cxx11-cpu-x86_64-linux"
X86_CU = "torch211-cxx11-cu130-x86_64-linux"
ARM_CPU = "torch213-cxx11-cpu-aarch64-linux"
ARM_CU = "torch211-cxx11-cu130-aarch64-linux"
# the repos of demo_repos()
ACTIVATION = f"{ORG}/activation"
RELU = f"{ORG}/relu"
LAYERNORM = f"{ORG}/layernorm"

_INIT = '''"""Fixture kernel {name} ({variant}), built by frt-mirror's tests."""

VERSION = {version}
VARIANT = "{variant}"
REVISION_NOTE = "{note}"


def add(a, b):
    return a + b


def silu_and_mul(x):
    import torch

    d = x.shape[-1] // 2
    return torch.nn.functional.silu(x[..., :d]) * x[..., d:]
'''


def backend_type(variant: str) -> str:
    """metadata backend.type: one of cann/cpu/cuda/metal/neuron/rocm/tpu/xpu (universal declares cpu)."""
    for token, kind in (("-cu", "cuda"), ("cuda", "cuda"), ("rocm", "rocm"), ("xpu", "xpu"), ("metal", "metal")):
        if token in variant:
            return kind
    return "cpu"


def publisher_digest(files: dict[str, bytes]) -> dict:
    """metadata.json `digest` as kernel-builder writes it: base64 of each file's raw sha256, over the
    variant's files (paths inside it) except metadata.json, its .sigstore and __pycache__/."""
    return {
        "algorithm": "sha256",
        "files": {
            rel: base64.b64encode(hashlib.sha256(data).digest()).decode()
            for rel, data in sorted(files.items())
            if rel not in ("metadata.json", "metadata.json.sigstore") and not rel.startswith("__pycache__/")
        },
    }


DEFAULT_CUDA_ARCHS = ["8.0", "9.0", "10.0"]


def variant_files(
    name: str,
    variant: str,
    *,
    version: int,
    note: str = "",
    extra: dict | None = None,
    depends: list | None = None,
    digest: bool = True,
    archs: list[str] | None | str = "default",
    python_depends: list[str] | None = None,
) -> dict[str, bytes]:
    """The files of one build variant directory, keyed by repo path; metadata.json carries the
    publisher's digest of the others unless `digest=False` (as older builds have none). `archs`: its
    backend.archs (None: none declared, a noarch build); by default CUDA builds declare 8.0, 9.0, 10.0."""
    kind = backend_type(variant)
    if archs == "default":
        archs = DEFAULT_CUDA_ARCHS if kind == "cuda" else None
    tag = hashlib.sha1(f"{name}/{variant}/{version}".encode()).hexdigest()[:8]
    meta = {
        "id": f"_{name.replace('-', '_')}_{tag}",
        "name": name,
        "version": version,
        "license": "apache-2.0",
        "python-depends": list(python_depends or []),
        "backend": {"type": kind, **({"archs": list(archs)} if archs else {})},
    }
    if depends:
        meta["kernel-depends"] = depends
    inner = {
        "__init__.py": _INIT.format(name=name, variant=variant, version=version, note=note).encode(),
        **(extra or {}),
    }
    if digest:
        meta["digest"] = publisher_digest(inner)
    inner["metadata.json"] = json.dumps(meta, indent=2).encode()
    return {f"build/{variant}/{rel}": data for rel, data in inner.items()}


def build(
    name: str,
    variants: list[str],
    *,
    version: int,
    note: str = "",
    extra: dict | None = None,
    depends: list | None = None,
    digest: bool = True,
    archs: dict[str, list[str] | None] | None = None,
) -> dict:
    """`archs`: per variant, its backend.archs where not the default (None: a noarch build)."""
    out: dict[str, bytes] = {"README.md": f"# {name}\n".encode(), "build/": None}
    for v in variants:
        out.update(
            variant_files(
                name,
                v,
                version=version,
                note=note,
                extra=extra,
                depends=depends,
                digest=digest,
                **({"archs": archs[v]} if archs and v in archs else {}),
            )
        )
    return out


def blob(seed: str, size: int) -> bytes:
    """Deterministic incompressible bytes, standing in for a compiled .so (above the LFS threshold)."""
    out, counter = bytearray(), 0
    while len(out) < size:
        out += hashlib.sha256(f"{seed}:{counter}".encode()).digest()
        counter += 1
    return bytes(out[:size])


def activation_repo() -> FakeRepo:
    repo = FakeRepo(f"{ORG}/activation")
    so = {"_activation.abi3.so": blob("activation-v1", 96 * 1024)}
    v1 = [X86_CU, X86_CPU, "torch-cpu"]
    repo.commit(build("activation", v1, version=1, note="initial", extra=so), title="Initial build", branch="v1")
    repo.commit(build("activation", v1, version=1, note="rebuild", extra=so), title="Rebuild with fixes", branch="v1")
    repo.commit(
        build("activation", v1 + [ARM_CU, ARM_CPU], version=1, note="aarch64", extra=so),
        title="Add aarch64 builds",
        branch="v1",
    )
    repo.commit(
        build("activation", v1 + [ARM_CPU], version=1, note="cu-rebuild", extra=so),
        title="Rebuild CUDA (aarch64 CUDA dropped)",
        branch="v1",
    )
    so2 = {"_activation.abi3.so": blob("activation-v2", 128 * 1024)}
    v2 = [X86_CU, X86_CPU, ARM_CU, ARM_CPU, "torch-cpu", "torch-cuda"]
    repo.commit(build("activation", v2, version=2, note="v2", extra=so2), title="v2: new API", branch="v2")
    repo.commit(build("activation", v2, version=2, note="v2.1", extra=so2), title="v2: faster", branch="v2")
    repo.branch("main", "v2")
    repo.branch("release/v1", "v1")
    repo.tag("v1.0.0", "v1")
    return repo


def relu_repo() -> FakeRepo:
    repo = FakeRepo(f"{ORG}/relu")
    repo.commit(build("relu", ["torch-universal"], version=1, note="initial"), title="Initial build", branch="v1")
    repo.commit(build("relu", ["torch-universal", X86_CPU], version=1, note="cpu"), title="Add CPU build", branch="v1")
    repo.branch("main", "v1")
    return repo


def layernorm_repo() -> FakeRepo:
    """Depends on activation v2 through metadata.json `kernel-depends`: staging it stages both."""
    repo = FakeRepo(f"{ORG}/layernorm")
    deps = [{"repo-id": f"{ORG}/activation", "version": 2}]
    repo.commit(
        build("layernorm", [X86_CPU, ARM_CPU, "torch-cuda"], version=1, note="initial", depends=deps),
        title="Initial build",
        branch="v1",
    )
    return repo


H100_CU = "torch213-cxx11-cu130-x86_64-linux"  # this box's torch, so a faked CUDA device can load it


def fleet_repos() -> list[FakeRepo]:
    """For an A100 (8.0) + H100 (9.0) fleet: `hopper`'s v1 head was rebuilt for 9.0 only (its first commit
    covered 8.0 too) and has no fallback; `hopper-fb` builds 9.0 only beside a noarch Triton-style
    torch-cuda that declares no archs."""
    hopper = FakeRepo(f"{ORG}/hopper")
    hopper.commit(
        build("hopper", [H100_CU], version=1, note="sm80-sm90", archs={H100_CU: ["8.0", "9.0"]}),
        title="Initial build",
        branch="v1",
    )
    hopper.commit(
        build("hopper", [H100_CU], version=1, note="sm90-only", archs={H100_CU: ["9.0"]}),
        title="Rebuild for Hopper only",
        branch="v1",
    )
    fb = FakeRepo(f"{ORG}/hopper-fb")
    fb.commit(
        build(
            "hopper-fb",
            [H100_CU, "torch-cuda"],
            version=1,
            note="sm90+triton",
            archs={H100_CU: ["9.0"], "torch-cuda": None},
        ),
        title="Hopper build and a Triton fallback",
        branch="v1",
    )
    return [hopper, fb]


def einsum_repo() -> FakeRepo:
    """A kernel whose builds need einops (metadata.json `python-depends`, kernels' curated list): kernels
    refuses to load it where einops cannot be imported. Its module uses einops, so the load proves it."""
    repo = FakeRepo(f"{ORG}/einsum")
    uses = {"ops.py": b"import einops\n\n\ndef einops_version():\n    return einops.__version__\n"}
    files: dict = {"README.md": b"# einsum\n", "build/": None}
    for v in (X86_CPU, "torch-cpu"):
        files.update(variant_files("einsum", v, version=1, note="einops", extra=uses, python_depends=["einops"]))
    repo.commit(files, title="Initial build (needs einops)", branch="v1")
    return repo


def demo_repos() -> list[FakeRepo]:
    return [activation_repo(), relu_repo(), layernorm_repo()]
