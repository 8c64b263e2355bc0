"""A compiled fixture kernel: C++ RMSNorm and SiLU built with ``torch.utils.cpp_extension`` for this host.

``seat-compiled`` has two builds in one commit: the arch variant of this host (for torch 2.13 on
x86_64 Linux, ``torch213-cxx11-cpu-x86_64-linux``; the name is computed from the resolver's host
target, never written down) holding a real ``.so``, and a pure-torch ``torch-universal`` fallback
with the same API. A host that can load the arch variant must be given it: the fallback exists so
that the resolver's preference is visible.

The ``.so`` registers its ops with ``TORCH_LIBRARY`` under a namespace derived from the build key, so
two different builds never collide in one process; ``__init__.py`` loads it by a path relative to
the package (as kernel-builder's packages do) and registers it once per process.

Compiling takes half a minute on a small box, so the ``.so`` is cached between runs under
``${FRT_TEST_CACHE:-~/.cache/frt-mirror/test-builds}``, keyed by a hash of the C++ source, torch's
version and ABI, the compiler, Python and the flags. An entry is trusted only if its ``build.json``
names that key and the ``.so`` still has the sha256 recorded there; anything else is rebuilt. Builds
run under a file lock, in a temporary directory renamed into place, so concurrent builders (two
pytest runs, xdist workers) neither corrupt an entry nor compile twice.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.support.fakehub import FakeRepo
from tests.support.kernel_fixtures import ORG

COMPILED = f"{ORG}/seat-compiled"
FLAGS = ("-O2",)
_BUILDER = "1"  # bump when the way an entry is laid out or built changes: old entries stop matching
_LOCK_TIMEOUT_S = 900.0  # a waiting builder outlives one cold build on a loaded 2-core box

# The ops namespace is a macro (-DFRT_NS=...), so the source and its hash do not depend on the key.
# TORCH_LIBRARY pastes its argument with ##, which would not expand FRT_NS: hence one more macro level.
CPP_SOURCE = r"""// Fixture kernel seat-compiled: RMSNorm and SiLU on CPU, ops in the namespace FRT_NS.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/mul.h>
#include <torch/library.h>

#include <cmath>

namespace {

// Rounds as transformers' RMSNorm does: statistics in float, the normalised row rounded to the input
// dtype, then scaled by the weight (rounded again) when the weight has the input's dtype.
template <typename T>
void rms_norm_rows(const T* x, const T* w, T* y, int64_t rows, int64_t n, float eps) {
  at::parallel_for(0, rows, 64, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const T* xr = x + r * n;
      T* yr = y + r * n;
      float sum = 0.f;
      for (int64_t i = 0; i < n; ++i) {
        const float v = static_cast<float>(xr[i]);
        sum += v * v;
      }
      const float inv = 1.f / std::sqrt(sum / static_cast<float>(n) + eps);
      for (int64_t i = 0; i < n; ++i) {
        const T normed = static_cast<T>(static_cast<float>(xr[i]) * inv);
        yr[i] = w ? static_cast<T>(static_cast<float>(w[i]) * static_cast<float>(normed)) : normed;
      }
    }
  });
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == weight.numel(), "rms_norm: the last dimension of x (",
              x.dim() ? x.size(-1) : 0, ") must equal the weight's size (", weight.numel(), ")");
  const at::Tensor xc = x.contiguous();
  const bool fused = weight.scalar_type() == x.scalar_type();
  const at::Tensor wc = weight.contiguous();
  at::Tensor y = at::empty_like(xc);
  const int64_t n = xc.size(-1), rows = n ? xc.numel() / n : 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, xc.scalar_type(), "rms_norm", [&] {
    rms_norm_rows<scalar_t>(xc.const_data_ptr<scalar_t>(), fused ? wc.const_data_ptr<scalar_t>() : nullptr,
                            y.mutable_data_ptr<scalar_t>(), rows, n, static_cast<float>(eps));
  });
  return fused ? y : at::mul(weight, y);  // mixed dtypes: torch's promotion, as the module would
}

template <typename T>
void silu_flat(const T* x, T* y, int64_t n) {
  at::parallel_for(0, n, 4096, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const float v = static_cast<float>(x[i]);
      y[i] = static_cast<T>(v / (1.f + std::exp(-v)));
    }
  });
}

at::Tensor silu(const at::Tensor& x) {
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty_like(xc);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, xc.scalar_type(), "silu", [&] {
    silu_flat<scalar_t>(xc.const_data_ptr<scalar_t>(), y.mutable_data_ptr<scalar_t>(), xc.numel());
  });
  return y;
}

}  // namespace

#define FRT_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)
#define FRT_LIBRARY_IMPL(ns, k, m) TORCH_LIBRARY_IMPL(ns, k, m)

FRT_LIBRARY(FRT_NS, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("silu(Tensor x) -> Tensor");
}

FRT_LIBRARY_IMPL(FRT_NS, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("silu", &silu);
}
"""

# Run in a child process: cpp_extension.load() with is_python_module=False also loads the library into
# the calling process, and its per-process versioner skips a second build of the same name. The test
# process must only ever load the staged copy.
_BUILD_SCRIPT = r"""
import json, sys, torch
from torch.utils.cpp_extension import load

name, source, build_dir, *flags = sys.argv[1:]
path = load(name, [source], extra_cflags=flags, build_directory=build_dir, is_python_module=False)
ops = getattr(torch.ops, name)
assert hasattr(ops, "rms_norm") and hasattr(ops, "silu"), "the library registered no ops"
print(json.dumps({"library": path}))
"""


class BuildUnavailable(RuntimeError):
    """This machine cannot build the extension (no C++ compiler or no ninja): the tests skip, saying so."""


@dataclass(frozen=True)
class CompiledBuild:
    key: str
    namespace: str  # torch.ops namespace, also the .so's file stem
    library: Path  # the cached .so
    sha256: str
    cache_hit: bool
    seconds: float  # this call: a lookup on a hit, a lookup plus a compile otherwise
    build_seconds: float  # the compile that made the entry (recorded in build.json)
    rebuilt_because: str | None = None  # why an existing entry was not trusted


def host_variant() -> str:
    """This host's arch variant name, from the resolver's host target and the ABI torch was built with."""
    import torch
    from kernels.backends import parse_backend
    from kernels.variants import Arch, ArchVariant, Torch

    from frt.resolver.targets import host_target

    t = host_target()
    abi = torch.compiled_with_cxx11_abi() if t.os == "linux" else None
    variant = ArchVariant(Torch(version=t.torch, cxx11_abi=abi), Arch(parse_backend(t.backend), t.cpu, t.os))
    return variant.variant_str


def cache_root(environ: Mapping[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    return Path(environ.get("FRT_TEST_CACHE") or Path.home() / ".cache" / "frt-mirror" / "test-builds")


def _build_env() -> dict[str, str]:
    """The builder's environment: the interpreter's bin directory first on PATH, where ``pip install
    ninja`` puts the binary, since ``.venv/bin/python -m pytest`` runs without an activated venv."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return {**os.environ, "PATH": path}


def _compiler() -> str:
    """What cpp_extension will call (``$CXX``, else ``c++``), by its own version line."""
    cxx, path = os.environ.get("CXX", "c++"), _build_env()["PATH"]
    if shutil.which(cxx, path=path) is None:
        raise BuildUnavailable(f"no C++ compiler ({cxx!r} is not on PATH)")
    if shutil.which("ninja", path=path) is None:
        raise BuildUnavailable("ninja is not on PATH; torch.utils.cpp_extension.load needs it (pip install ninja)")
    p = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=True, env=_build_env())
    return p.stdout.splitlines()[0].strip()


def build_key() -> str:
    """Everything the bytes of the .so depend on (Python too: the library links libtorch_python)."""
    import torch

    parts = {
        "builder": _BUILDER,
        "source": CPP_SOURCE,
        "torch": torch.__version__,
        "cxx11_abi": torch.compiled_with_cxx11_abi(),
        "compiler": _compiler(),
        "flags": list(FLAGS),
        "python": sys.implementation.cache_tag,
        "machine": platform.machine(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def entry_problem(entry: Path, key: str) -> str | None:
    """Why a cache entry must not be used, or None. The sha256 check catches a .so changed after the build."""
    try:
        info = json.loads((entry / "build.json").read_text())
    except (OSError, ValueError) as e:
        return f"no readable build.json ({type(e).__name__})"
    if info.get("key") != key:
        return f"build.json names key {str(info.get('key'))[:12]}, not {key[:12]}"
    lib = entry / f"{info.get('namespace')}.so"
    try:
        digest = _sha256(lib)
    except OSError as e:
        return f"{lib.name} is unreadable ({type(e).__name__})"
    if digest != info.get("sha256"):
        return f"{lib.name} has sha256 {digest[:12]}, build.json recorded {str(info.get('sha256'))[:12]}"
    return None


def build_compiled(root: Path | None = None) -> CompiledBuild:
    """The cached build for this host, compiled first if the cache has no trustworthy entry for its key."""
    from filelock import FileLock

    start = time.perf_counter()
    key = build_key()
    base = (root or cache_root()) / "seat-compiled"
    base.mkdir(parents=True, exist_ok=True)
    entry = base / key
    with FileLock(str(base / f"{key}.lock"), timeout=_LOCK_TIMEOUT_S):
        problem = entry_problem(entry, key) if entry.exists() else None
        hit = entry.exists() and problem is None
        if not hit:
            _build_into(entry, key)
        info = json.loads((entry / "build.json").read_text())
    return CompiledBuild(
        key,
        info["namespace"],
        entry / f"{info['namespace']}.so",
        info["sha256"],
        hit,
        time.perf_counter() - start,
        info["build_seconds"],
        problem,
    )


def _build_into(entry: Path, key: str) -> None:
    """Compile in a fresh directory beside ``entry`` and rename it into place (the caller holds the lock)."""
    namespace = f"_frt_seat_compiled_{key[:16]}"
    tmp = Path(tempfile.mkdtemp(prefix=f".{key[:12]}-", dir=entry.parent))
    try:
        source = tmp / "kernel.cpp"
        source.write_text(CPP_SOURCE)
        start = time.perf_counter()
        argv = [sys.executable, "-c", _BUILD_SCRIPT, namespace, str(source), str(tmp), *FLAGS, f"-DFRT_NS={namespace}"]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=_LOCK_TIMEOUT_S, env=_build_env())
        seconds = time.perf_counter() - start
        if p.returncode != 0:
            raise RuntimeError(f"building {namespace} failed:\n{p.stdout}\n{p.stderr}")
        lib = tmp / f"{namespace}.so"
        for junk in tmp.iterdir():  # objects and ninja state: only the source, the .so and build.json stay
            if junk not in (source, lib):
                junk.unlink()
        info = {
            "key": key,
            "namespace": namespace,
            "sha256": _sha256(lib),
            "flags": list(FLAGS),
            "build_seconds": round(seconds, 3),
        }
        (tmp / "build.json").write_text(json.dumps(info, indent=2))
        tmp.chmod(0o755)  # mkdtemp made it private; the entry is an ordinary cache directory
        if entry.exists():  # an untrusted entry: out of the way first (rename does not replace a directory)
            stale = Path(tempfile.mkdtemp(prefix=f".stale-{key[:12]}-", dir=entry.parent))
            entry.rename(stale / "entry")
            shutil.rmtree(stale, ignore_errors=True)
        tmp.rename(entry)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- the repo in the Hub layout ------------------------------------------------------------------

_COMPILED_INIT = '''"""Fixture kernel seat-compiled ({variant}): a C++ extension built by frt-mirror tests."""

from pathlib import Path

import torch

from . import layers

NAMESPACE = "{namespace}"
LIBRARY = Path(__file__).with_name(NAMESPACE + ".so")

# The namespace is derived from the build key, so if it is registered, this very code is: a second
# copy of this variant (another staged home in the same process) must not register it again, which
# TORCH_LIBRARY refuses.
if not hasattr(getattr(torch.ops, NAMESPACE), "rms_norm"):
    torch.ops.load_library(str(LIBRARY))
ops = getattr(torch.ops, NAMESPACE)


def rms_norm(x, weight, eps):
    return ops.rms_norm(x, weight, eps)


def silu(x):
    return ops.silu(x)
'''

_FALLBACK_INIT = '''"""Fixture kernel seat-compiled (torch-universal): the pure-torch fallback."""

import torch

from . import layers


def rms_norm(x, weight, eps):
    y = x.float()
    y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)
    return weight * y.to(x.dtype)


def silu(x):
    return x * torch.sigmoid(x)
'''

_LAYERS = '''"""Kernels-style layers: forward only, reading the replaced module's own weight and epsilon."""

import torch


class RMSNorm(torch.nn.Module):
    can_torch_compile = False
    has_backward = False

    def forward(self, hidden_states):
        from . import rms_norm

        return rms_norm(hidden_states, self.weight, self.variance_epsilon)
'''


def _metadata(variant: str, key: str) -> bytes:
    meta = {
        "id": f"_seat_compiled_{key[:12]}_{variant.replace('-', '_')}",
        "name": "seat-compiled",
        "version": 1,
        "license": "apache-2.0",
        "python-depends": [],
        "backend": {"type": "cpu"},
    }
    return json.dumps(meta, indent=2).encode()


def compiled_repo(build: CompiledBuild) -> FakeRepo:
    """``seat-compiled`` v1: this host's arch variant (the cached .so) and a torch-universal fallback."""
    library = build.library.read_bytes()
    if hashlib.sha256(library).hexdigest() != build.sha256:  # replaced since build_compiled checked it
        raise RuntimeError(f"{build.library} changed after it was checked: call build_compiled() again")
    arch_name = host_variant()
    arch = f"build/{arch_name}"
    files: dict[str, bytes | None] = {
        "README.md": b"# seat-compiled\n",
        f"{arch}/__init__.py": _COMPILED_INIT.format(variant=arch_name, namespace=build.namespace).encode(),
        f"{arch}/layers.py": _LAYERS.encode(),
        f"{arch}/{build.namespace}.so": library,
        f"{arch}/metadata.json": _metadata(arch_name, build.key),
        "build/torch-universal/__init__.py": _FALLBACK_INIT.encode(),
        "build/torch-universal/layers.py": _LAYERS.encode(),
        "build/torch-universal/metadata.json": _metadata("torch-universal", build.key),
    }
    repo = FakeRepo(COMPILED)
    repo.commit(files, title="seat-compiled v1", branch="v1")
    repo.branch("main", "v1")
    return repo


def staged_compiled_home(root: Path, build: CompiledBuild) -> Path:
    """Stage ``seat-compiled`` v1 for this host with the real ``frt-mirror stage``, from a fake Hub that
    is stopped before this returns."""
    from frt.resolver.targets import host_target
    from tests.support.cli import run_cli
    from tests.support.fakehub import FakeHub
    from tests.support.seat_fixtures import write_stage_manifest

    home = root / "home"
    with FakeHub([compiled_repo(build)], trusted_orgs=[ORG]) as hub:
        manifest = write_stage_manifest(root / "compiled-manifest.toml", str(host_target()), (COMPILED,))
        p = run_cli("--endpoint", hub.url, "stage", str(manifest), home=home)
    if p.returncode != 0:
        raise RuntimeError(f"staging {COMPILED} failed:\n{p.stdout}\n{p.stderr}")
    return home
