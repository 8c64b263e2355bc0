"""Targets: the system a kernel must load on, which need not be this machine.

Syntax: ``torch<M>.<m>-<backend>-<cpu>-<os>`` (``torch2.11-cu130-aarch64-linux``) or ``host``.
The backend token is a build-variant backend (``cpu``, ``cu130``, ``rocm71``, ``xpu20253``,
``metal``, ``cann81``, ``neuron``, ``tpu``) and is validated by the ``kernels`` library's parser.
"""

from __future__ import annotations

import platform
import re
from dataclasses import dataclass, field

from packaging.version import Version

from .errors import BadInput

_TARGET_RE = re.compile(r"torch(?P<major>\d+)\.(?P<minor>\d+)-(?P<backend>[a-z0-9]+)-(?P<cpu>[a-z0-9_]+)-(?P<os>[a-z]+)")

# What build variants name and kernels normalizes a system to (kernels.variants: arm64 -> aarch64 on
# darwin, AMD64 -> x86_64 on windows); kernel-builder builds for no other.
CPUS = ("x86_64", "aarch64")
OSES = ("linux", "darwin", "windows")

# pip wheels of torch on Linux use the C++11 ABI from 2.7 on (older ones were cxx98);
# a target names no ABI, so we assume the one the official wheels of that minor have.
_CXX11_SINCE = Version("2.7")


@dataclass(frozen=True, order=True)
class Target:
    torch: Version | None
    backend: str
    cpu: str
    os: str
    # A manifest's label for the target; not part of its identity.
    name: str | None = field(default=None, compare=False)

    @property
    def cxx11_abi(self) -> bool | None:
        if self.os != "linux" or self.torch is None:
            return None
        return self.torch >= _CXX11_SINCE

    def __str__(self) -> str:
        if self.torch is None:
            return f"notorch-{self.backend}-{self.cpu}-{self.os}"
        return f"torch{self.torch.major}.{self.torch.minor}-{self.backend}-{self.cpu}-{self.os}"

    @property
    def label(self) -> str:
        """The name a manifest gave this target, else its string."""
        return self.name or str(self)


def parse_target(text: str, *, name: str | None = None) -> Target:
    """Parse a target string, or ``host``; raise `BadInput` with the expected syntax otherwise."""
    text = text.strip()
    if text == "host":
        return _host_as_named_target()
    m = _TARGET_RE.fullmatch(text)
    if not m:
        raise BadInput(
            f"unknown target {text!r}: expected torch<M>.<m>-<backend>-<cpu>-<os> "
            "(e.g. torch2.11-cu130-x86_64-linux) or 'host'"
        )
    return make_target(
        torch=f"{m['major']}.{m['minor']}", backend=m["backend"], cpu=m["cpu"], os=m["os"], name=name
    )


def make_target(*, torch: str | None, backend: str, cpu: str, os: str, name: str | None = None) -> Target:
    """Build a target from its fields (a manifest's ``[[targets]]`` table), validating each."""
    from kernels.backends import parse_backend

    try:
        parsed = parse_backend(backend)
    except ValueError:
        parsed = None
    # kernels reads "cu13" as CUDA 1.3: no torch was ever built for it. A build variant names CUDA
    # by its major (11+) and minor, cu<MM><m>.
    if parsed is None or (parsed.name == "cuda" and parsed.version.major < 11):
        raise BadInput(
            f"unknown backend {backend!r} in target: expected cpu, cu<MM><m> (cu126, cu130), rocm<M><m>, "
            "xpu<YYYY><n>, cann<M><m>, metal, neuron or tpu"
        ) from None
    version = None
    if torch is not None:
        if not re.fullmatch(r"\d+\.\d+", str(torch)):
            raise BadInput(f"bad torch version {torch!r} in target: expected <major>.<minor>, e.g. 2.11")
        version = Version(str(torch))
    if cpu not in CPUS or os not in OSES:
        raise BadInput(f"unknown cpu/os {cpu!r}/{os!r} in target: expected a cpu of {', '.join(CPUS)} and an "
                       f"os of {', '.join(OSES)}")
    return Target(torch=version, backend=backend, cpu=cpu, os=os, name=name)


def _host_as_named_target() -> Target:
    """`host` as a user's target: only where this machine is one a kernel can be built for.

    Without torch, `host_target()` is the noarch-only system kernels itself sees here (useful to
    compare choices), but it is no target a cluster has: recorded, staged and bundled under a
    name like ``notorch-cu130-x86_64-linux`` it would be refused by every parser downstream.
    """
    target = host_target()
    if target.torch is None:
        raise BadInput("--target host needs torch on this box, and it has none (a stager need not be the "
                       "target): name the cluster's target instead, e.g. --target torch2.11-cu130-x86_64-linux")
    return target


def host_target() -> Target:
    """This machine as a target, detected the way ``kernels`` detects it when it loads.

    Without torch the target has no torch version: only noarch variants can match it,
    which is exactly what ``kernels`` itself would accept here.
    """
    from kernels.backends import _backend
    from kernels.compat import has_torch

    cpu = platform.machine()
    os = platform.system().lower()
    if os == "darwin" and cpu == "arm64":
        cpu = "aarch64"
    elif os == "windows" and cpu == "AMD64":
        cpu = "x86_64"
    torch_version = None
    if has_torch:
        import torch

        v = Version(torch.__version__)
        torch_version = Version(f"{v.major}.{v.minor}")
    return Target(torch=torch_version, backend=_backend().variant_str, cpu=cpu, os=os, name="host")
