"""A kernel library nobody here wrote, as a Hub kernel: Liger-Kernel's Triton RMSNorm and SwiGLU.

liger-kernel 0.8.5 (PyPI, BSD-2-Clause, LinkedIn) is built for training-sized tensors. Its wheel is
not a Hub kernel, so the tests package it as one, the way kernel-builder publishes a library: a
noarch ``torch-cuda`` variant, ``build/torch-cuda/liger_kernels/``, with ``metadata.json`` (backend
cuda, license BSD-2-Clause, the publisher's digest of every file) beside it. The kernel's own files
are Liger's, read from its wheel (or from the installed distribution) and checked against the
wheel's RECORD hashes; the only change made to them is that their ``from liger_kernel.`` imports
become relative, so the package imports from the staged view and from nowhere else (kernel-builder
does the same: a Hub kernel cannot import a sibling it does not ship). ``PROVENANCE.json`` records
each file's wheel path, RECORD hash and rewritten lines. Ours are only the glue: ``__init__.py``
(two functions) and ``layers.py`` (kernels-style layers), and nothing of Liger is rewritten in them.

- ``rms_norm(x, weight, eps)`` and ``layers.RMSNorm``: Liger's ``rms_norm_forward`` in its "llama"
  casting mode (fp32 statistics, the normalised row cast to the input dtype, then the weight), which
  is how transformers' Qwen3RMSNorm rounds.
- ``swiglu(gate, up)`` and ``layers.SwiGLUMLP`` (an ``mlp`` seat: the whole gated block, its own
  projections, Liger's fused SiLU-and-mul between them): Liger's ``swiglu_forward``.

Both call Liger's forward functions directly rather than through its autograd Functions: a seat is
forward-only, and the Function's ctx costs microseconds per decode-sized call.

Where the wheel comes from: ``$FRT_LIGER_WHEEL``, else ``device-wheels/liger_kernel-0.8.5-*.whl``
in the repo root (bench/device_wheels.sh downloads it), else an installed ``liger-kernel`` 0.8.5.
None of them: `liger_source` says so, and the Liger tests skip with that line.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tests.support import ROOT
from tests.support.fakehub import FakeRepo
from tests.support.kernel_fixtures import ORG, publisher_digest

LIGER_VERSION = "0.8.5"
LIGER = f"{ORG}/liger-kernels"
PACKAGE = "liger_kernels"  # metadata name liger-kernels, as kernels names the module

# Liger's files in its wheel -> where they sit in the kernel package (the wheel's own tree, under _liger/).
FILES = {
    "liger_kernel/utils.py": "_liger/utils.py",
    "liger_kernel/ops/utils.py": "_liger/ops/utils.py",
    "liger_kernel/ops/rms_norm.py": "_liger/ops/rms_norm.py",
    "liger_kernel/ops/swiglu.py": "_liger/ops/swiglu.py",
    f"liger_kernel-{LIGER_VERSION}.dist-info/licenses/LICENSE": "LICENSE",
}

_INIT = '''"""Liger-Kernel {version}'s Triton RMSNorm and SwiGLU as a Hub kernel (BSD-2-Clause: LICENSE beside this).

Packaged by frt-mirror's tests (tests/support/liger_fixture.py). Everything under _liger/ is Liger's own, from
its wheel, imports made relative (PROVENANCE.json); this file and layers.py are the glue.
"""

from ._liger.ops.rms_norm import rms_norm_forward
from ._liger.ops.swiglu import swiglu_forward


def rms_norm(x, weight, eps):
    # casting mode "llama": fp32 statistics, the row cast back to x's dtype before the weight (Qwen3's rounding)
    return rms_norm_forward(x.contiguous(), weight, eps, 0.0, "llama", None)[0]


def swiglu(gate, up):
    return swiglu_forward(gate.contiguous(), up.contiguous())[2]


from . import layers  # noqa: E402  (after the functions: layers imports them)
'''

_LAYERS = '''"""kernels-style layers over Liger's functions (forward only, reading the replaced module's weights)."""

import torch

from . import rms_norm, swiglu


class RMSNorm(torch.nn.Module):
    can_torch_compile = True
    has_backward = False

    def forward(self, hidden_states):
        return rms_norm(hidden_states, self.weight, self.variance_epsilon)


class SwiGLUMLP(torch.nn.Module):
    """A gated MLP block, ``down(silu(gate(x)) * up(x))``, with Liger's fused SiLU-and-mul."""

    can_torch_compile = True
    has_backward = False

    def forward(self, x):
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))
'''


class LigerUnavailable(Exception):
    """No liger-kernel 0.8.5 to package here; ``str(e)`` says where it looked and how to get it."""


@dataclass(frozen=True)
class LigerSource:
    origin: str  # the wheel file, or "installed distribution at ..."
    files: dict[str, bytes]  # wheel path -> bytes, each checked against the wheel's RECORD
    record: dict[str, str]  # wheel path -> RECORD hash ("sha256=...")


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _checked(origin: str, record_text: str, read) -> LigerSource:
    record = {}
    for line in record_text.splitlines():
        path, _, rest = line.partition(",")
        record[path] = rest.partition(",")[0]
    files = {}
    for path in FILES:
        data = read(path)
        if not record.get(path) or _record_hash(data) != record[path]:
            raise LigerUnavailable(f"{origin}: {path} does not match the wheel's RECORD ({record.get(path)})")
        files[path] = data
    return LigerSource(origin, files, {p: record[p] for p in FILES})


def _from_wheel(wheel: Path) -> LigerSource:
    with zipfile.ZipFile(wheel) as z:
        record = z.read(f"liger_kernel-{LIGER_VERSION}.dist-info/RECORD").decode()
        return _checked(str(wheel), record, z.read)


def _from_installed() -> LigerSource | None:
    from importlib import metadata

    try:
        dist = metadata.distribution("liger-kernel")
    except metadata.PackageNotFoundError:
        return None
    if dist.version != LIGER_VERSION:
        raise LigerUnavailable(f"liger-kernel {dist.version} is installed; these tests package {LIGER_VERSION}")
    record = dist.read_text("RECORD") or ""
    return _checked(
        f"installed distribution at {dist.locate_file('')}", record, lambda p: Path(dist.locate_file(p)).read_bytes()
    )


def liger_source(environ: dict | None = None) -> LigerSource:
    """Liger's files, from the first place that has them (see the module's docstring)."""
    import os

    env = os.environ if environ is None else environ
    wheels = [Path(env["FRT_LIGER_WHEEL"])] if env.get("FRT_LIGER_WHEEL") else []
    wheels += sorted((ROOT / "device-wheels").glob(f"liger_kernel-{LIGER_VERSION}-*.whl"))
    for wheel in wheels:
        if wheel.is_file():
            return _from_wheel(wheel)
    found = _from_installed()
    if found is None:
        raise LigerUnavailable(
            f"no liger-kernel {LIGER_VERSION}: set FRT_LIGER_WHEEL, put its wheel in "
            f"{ROOT / 'device-wheels'} (bash bench/device_wheels.sh), or pip install "
            f"--no-deps liger-kernel=={LIGER_VERSION}"
        )
    return found


_ABSOLUTE = re.compile(r"^([ \t]*)from liger_kernel\.", re.M)


def relative_imports(wheel_path: str, text: str) -> tuple[str, list[int]]:
    """``from liger_kernel.x import y`` -> ``from ..x import y`` as seen from the file's own package
    inside _liger/ (which stands where liger_kernel/ stood); the lines changed, 1-based. Any other
    reference to the absolute package (``import liger_kernel``, ``from liger_kernel import``) would
    escape the staged view: refused rather than guessed."""
    depth = wheel_path.count("/")  # liger_kernel/utils.py: 1 (the package itself); ops/x.py: 2
    lines = [text.count("\n", 0, m.start()) + 1 for m in _ABSOLUTE.finditer(text)]
    out = _ABSOLUTE.sub(lambda m: f"{m.group(1)}from {'.' * depth}", text)
    stray = re.search(r"^[ \t]*(import liger_kernel|from liger_kernel\b)", out, re.M)
    if stray:
        raise LigerUnavailable(
            f"{wheel_path}: an import of liger_kernel the packaging does not rewrite: {stray.group(0).strip()!r}"
        )
    return out, lines


def variant_files(source: LigerSource, version: int = 1) -> dict[str, bytes]:
    """The files of ``build/torch-cuda/`` for this package, keyed by repo path."""
    inner: dict[str, bytes] = {}
    provenance = {
        "package": "liger-kernel",
        "version": LIGER_VERSION,
        "from": Path(source.origin).name,
        "rewrite": "from liger_kernel.X -> relative to the file's package under _liger/",
        "files": {},
    }
    for wheel_path, rel in FILES.items():
        data = source.files[wheel_path]
        lines: list[int] = []
        if rel.endswith(".py"):
            text, lines = relative_imports(wheel_path, data.decode())
            data = text.encode()
        inner[f"{PACKAGE}/{rel}"] = data
        provenance["files"][f"{PACKAGE}/{rel}"] = {
            "wheel_path": wheel_path,
            "record": source.record[wheel_path],
            "rewritten_lines": lines,
        }
    for pkg in ("_liger", "_liger/ops"):  # the wheel's own __init__.py import everything Liger has: ours are empty
        inner[f"{PACKAGE}/{pkg}/__init__.py"] = b""
    inner[f"{PACKAGE}/__init__.py"] = _INIT.format(version=LIGER_VERSION).encode()
    inner[f"{PACKAGE}/layers.py"] = _LAYERS.encode()
    inner[f"{PACKAGE}/PROVENANCE.json"] = json.dumps(provenance, indent=2).encode()
    meta = {
        "id": f"_liger_kernels_{hashlib.sha1(LIGER_VERSION.encode()).hexdigest()[:8]}_v{version}",
        "name": "liger-kernels",
        "version": version,
        "license": "BSD-2-Clause",
        "upstream": "https://github.com/linkedin/Liger-Kernel",
        "python-depends": [],
        "backend": {"type": "cuda"},
        "digest": publisher_digest(inner),
    }
    inner["metadata.json"] = json.dumps(meta, indent=2).encode()
    return {f"build/torch-cuda/{rel}": data for rel, data in inner.items()}


def liger_repo(source: LigerSource) -> FakeRepo:
    repo = FakeRepo(LIGER)
    repo.commit(
        {
            "README.md": f"# liger-kernels\n\nLiger-Kernel {LIGER_VERSION}, packaged by the tests.\n".encode(),
            **variant_files(source),
        },
        title=f"liger-kernel {LIGER_VERSION}",
        branch="v1",
    )
    repo.branch("main", "v1")
    return repo
