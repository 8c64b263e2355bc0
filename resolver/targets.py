"""Targets: the system a kernel must load on, which need not be this machine.

Syntax: ``torch<M>.<m>-<backend>-<cpu>-<os>[@ARCH,...]`` (``torch2.11-cu130-aarch64-linux``,
``torch2.11-cu130-x86_64-linux@8.0,9.0``, ``torch2.13-rocm71-x86_64-linux@gfx942``) or ``host``.
The backend token is a build-variant backend (``cpu``, ``cu130``, ``rocm71``, ``xpu20253``,
``metal``, ``cann81``, ``neuron``, ``tpu``) and is validated by the ``kernels`` library's parser.
The archs after ``@`` are the fleet's GPUs (CUDA capabilities, ROCm gfx names): see archs.py.
"""

from __future__ import annotations

import platform
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from packaging.version import Version

from .errors import BadInput, BadTargetField

_TARGET_RE = re.compile(
    r"torch(?P<major>\d+)\.(?P<minor>\d+)-(?P<backend>[a-z0-9]+)-(?P<cpu>[a-z0-9_]+)-(?P<os>[a-z]+)"
)

# What build variants name and kernels normalizes a system to (kernels.variants: arm64 -> aarch64 on
# darwin, AMD64 -> x86_64 on windows); kernel-builder builds for no other.
CPUS = ("x86_64", "aarch64")
OSES = ("linux", "darwin", "windows")

# pip wheels of torch on Linux use the C++11 ABI from 2.7 on (older ones were cxx98);
# a target names no ABI, so we assume the one the official wheels of that minor have.
_CXX11_SINCE = Version("2.7")
# A darwin target names no macOS release: assume one new enough for Metal builds (kernels wants 26).
_MACOS_FOR_TARGETS = Version("26.0")


@dataclass(frozen=True, order=True)
class Target:
    torch: Version | None
    backend: str
    cpu: str
    os: str
    # The GPUs the target's builds must load on, canonical (archs.normalize); (): any device, by name only.
    archs: tuple[str, ...] = ()
    # A manifest's label for the target; not part of its identity.
    name: str | None = field(default=None, compare=False)
    # What kernels reads of a system beyond its name, as `host` detects it. A named target assumes the
    # official torch wheels' C++ ABI (abi None), macOS 26 on darwin (make_target) and no tvm-ffi.
    abi: bool | None = None
    macos: Version | None = None  # None on darwin: unknown, as kernels has it, and Metal builds are refused
    tvm_ffi: Version | None = None
    # The cluster's Python (major.minor) where known: a manifest's `python = "3.12"`, this interpreter for
    # `host`. Only the wheels of python-depends depend on it (binary ones need it), not the variant choice.
    python: str | None = field(default=None, compare=False)

    @property
    def cxx11_abi(self) -> bool | None:
        if self.os != "linux" or self.torch is None:
            return None
        return self.torch >= _CXX11_SINCE if self.abi is None else self.abi

    @property
    def device(self) -> str | None:
        """'cuda' or 'rocm' where kernels checks a build's archs on this target's devices."""
        from .archs import device_of

        return device_of(self.backend)

    @property
    def by_name(self) -> Target:
        """The target with no archs: what kernels itself sees when it picks a variant by name."""
        return replace(self, archs=()) if self.archs else self

    def __str__(self) -> str:
        at = f"@{','.join(self.archs)}" if self.archs else ""
        if self.torch is None:
            return f"notorch-{self.backend}-{self.cpu}-{self.os}{at}"
        return f"torch{self.torch.major}.{self.torch.minor}-{self.backend}-{self.cpu}-{self.os}{at}"

    @property
    def label(self) -> str:
        """The name a manifest gave this target, else its string."""
        return self.name or str(self)


def parse_target(text: str, *, name: str | None = None) -> Target:
    """Parse a target string, or ``host``; raise `BadInput` with the expected syntax otherwise."""
    text = text.strip()
    base, at, archs = text.partition("@")
    if base == "host":
        return with_archs(_host_as_named_target(), archs.split(",")) if at else _host_as_named_target()
    m = _TARGET_RE.fullmatch(base)
    if not m:
        raise BadInput(
            f"unknown target {text!r}: expected torch<M>.<m>-<backend>-<cpu>-<os>[@ARCH,...] "
            "(e.g. torch2.11-cu130-x86_64-linux, torch2.11-cu130-x86_64-linux@8.0,9.0) or 'host'"
        )
    return make_target(
        torch=f"{m['major']}.{m['minor']}",
        backend=m["backend"],
        cpu=m["cpu"],
        os=m["os"],
        name=name,
        archs=archs.split(",") if at else None,
    )


def with_archs(target: Target, archs: list[str] | tuple[str, ...]) -> Target:
    """`target` naming these GPU archs (checked; BadInput says what is wrong)."""
    try:
        from .archs import normalize

        return replace(target, archs=normalize(target.backend, archs))
    except ValueError as e:
        raise BadTargetField("archs", f"target {target.by_name}: {e}") from None


# The backend tokens kernels' parser takes (kernels.backends.parse_backend: the literal names, and
# <kind><major><minor> with one digit of minor, as its `cu(\d+)(\d+)` reads it), written out so that
# naming a target needs no import of kernels, which costs a cluster's `frt-mirror env` on every job start
# about ten times the rest of it. tests/test_targets.py holds it equal to kernels' parser.
_BACKEND_RE = re.compile(r"cpu|metal|neuron|tpu|(?P<kind>cu|rocm|xpu|cann)(?P<major>[0-9]+)[0-9]")


def known_backend(backend: str) -> bool:
    """Whether `backend` is a build-variant backend kernels parses, and a CUDA one names CUDA 11 or
    later: kernels reads "cu13" as CUDA 1.3, for which no torch was ever built (a build variant names
    CUDA by its major, 11+, and minor: cu<MM><m>)."""
    m = _BACKEND_RE.fullmatch(backend)
    return m is not None and (m["kind"] != "cu" or int(m["major"]) >= 11)


def make_target(
    *,
    torch: str | None,
    backend: str,
    cpu: str,
    os: str,
    name: str | None = None,
    archs: list[str] | tuple[str, ...] | None = None,
) -> Target:
    """Build a target from its fields (a manifest's ``[[targets]]`` table), validating each."""
    if not known_backend(backend):
        raise BadTargetField(
            "backend",
            f"unknown backend {backend!r} in target: expected cpu, cu<MM><m> (cu126, cu130), rocm<M><m>, "
            "xpu<YYYY><n>, cann<M><m>, metal, neuron or tpu",
        ) from None
    version = None
    if torch is not None:
        if not re.fullmatch(r"\d+\.\d+", str(torch)):
            raise BadTargetField("torch", f"bad torch version {torch!r} in target: expected <major>.<minor>, e.g. 2.11")
        version = Version(str(torch))
    if cpu not in CPUS:
        raise BadTargetField("cpu", f"unknown cpu {cpu!r} in target: expected one of {', '.join(CPUS)}")
    if os not in OSES:
        raise BadTargetField("os", f"unknown os {os!r} in target: expected one of {', '.join(OSES)}")
    target = Target(
        torch=version, backend=backend, cpu=cpu, os=os, name=name, macos=_MACOS_FOR_TARGETS if os == "darwin" else None
    )
    return with_archs(target, archs) if archs is not None else target


def _host_as_named_target() -> Target:
    """`host` as a user's target: only where this machine is one a kernel can be built for.

    Without torch, `host_target()` is the noarch-only system kernels itself sees here (useful to
    compare choices), but it is no target a cluster has: recorded, staged and bundled under a
    name like ``notorch-cu130-x86_64-linux`` it would be refused by every parser downstream.
    """
    import importlib.util

    from .host_cache import remembered_host

    if "torch" in sys.modules:  # an engine's process: detecting costs nothing there, no cache is read
        return host_target()
    torch = importlib.util.find_spec("torch")  # kernels' own has_torch test
    if torch is None or not torch.submodule_search_locations:
        raise BadInput(
            "--target host needs torch on this box, and it has none (a stager need not be the "
            "target): name the cluster's target instead, e.g. --target torch2.11-cu130-x86_64-linux"
        )
    torch_dir = Path(next(iter(torch.submodule_search_locations)))
    try:
        return _host_from_fields(remembered_host(lambda: _host_fields(host_target()), torch_dir))
    except (KeyError, TypeError, ValueError):  # kept by another frt-mirror, in another shape
        return host_target()


def _host_fields(t: Target) -> dict[str, object]:
    """What `host` detected, as JSON (host_cache keeps it)."""
    return {
        "torch": str(t.torch) if t.torch is not None else None,
        "backend": t.backend,
        "cpu": t.cpu,
        "os": t.os,
        "abi": t.abi,
        "macos": str(t.macos) if t.macos is not None else None,
        "tvm_ffi": str(t.tvm_ffi) if t.tvm_ffi is not None else None,
        "python": t.python,
    }


def _host_from_fields(doc: dict[str, object]) -> Target:
    def version(field: str) -> Version | None:
        value = doc[field]
        return Version(str(value)) if value is not None else None

    abi, python = doc["abi"], doc["python"]
    text = [doc[f] for f in ("backend", "cpu", "os")]
    if (
        not isinstance(abi, bool | None)
        or not isinstance(python, str | None)
        or not all(isinstance(v, str) for v in text)
    ):
        raise TypeError("not a host target's fields")
    backend, cpu, os = (str(v) for v in text)
    return Target(
        torch=version("torch"),
        backend=backend,
        cpu=cpu,
        os=os,
        name="host",
        abi=abi,
        macos=version("macos"),
        tvm_ffi=version("tvm_ffi"),
        python=python,
    )


def host_target() -> Target:
    """This machine as a target, detected the way ``kernels`` detects it when it loads
    (`kernels.variants.resolve_variants`): its C++ ABI, macOS release and tvm-ffi too.

    Without torch the target has no torch version: only noarch variants can match it,
    which is exactly what ``kernels`` itself would accept here.
    """
    import kernels.compat
    from kernels.backends import _backend

    cpu = platform.machine()
    os = platform.system().lower()
    if os == "darwin" and cpu == "arm64":
        cpu = "aarch64"
    elif os == "windows" and cpu == "AMD64":
        cpu = "x86_64"
    torch_version, abi = None, None
    if kernels.compat.has_torch:
        import torch

        v = Version(torch.__version__)
        torch_version = Version(f"{v.major}.{v.minor}")
        abi = torch.compiled_with_cxx11_abi() if os == "linux" else None
    return Target(
        torch=torch_version,
        backend=_backend().variant_str,
        cpu=cpu,
        os=os,
        name="host",
        abi=abi,
        macos=_host_macos() if os == "darwin" else None,
        tvm_ffi=_host_tvm_ffi(),
        python=f"{sys.version_info.major}.{sys.version_info.minor}",
    )


def _host_macos() -> Version | None:
    release = platform.mac_ver()[0]  # as kernels reads it
    return Version(release) if release else None


def _host_tvm_ffi() -> Version | None:
    import kernels.compat

    if not kernels.compat.has_tvm_ffi:
        return None
    import tvm_ffi

    v = Version(tvm_ffi.__version__)
    return Version(f"{v.major}.{v.minor}")
