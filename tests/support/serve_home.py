"""The home test_serve and its neighbours serve (the fixtures serve_staged and serve_mirror in
tests/conftest.py): demo kernels and `big`, a kernel with a 24 MiB LFS file, staged once from the fake Hub,
which is then stopped, a tripwire on its port."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from tests.support.cli import X86, run_cli, write_manifest
from tests.support.fakehub import FakeRepo
from tests.support.kernel_fixtures import ORG, X86_CPU, variant_files
from tests.support.serve_helpers import Tripwire

BIG = f"{ORG}/big"
SO = f"build/{X86_CPU}/_activation.abi3.so"
BIG_FILE = "build/torch-universal/_weights.bin"
BIG_SIZE = 24 << 20
MiB10 = 10 << 20


def big_repo() -> FakeRepo:
    """Three v1 commits of a torch-universal kernel; the last two carry a 24 MiB LFS file (big enough
    for huggingface_hub to resume a dropped download at 10 MiB). `release/v1` is the middle one."""
    weights = hashlib.shake_128(b"frt-big-weights").digest(BIG_SIZE)
    repo = FakeRepo(BIG)

    def build(note, extra=None):
        return variant_files("big", "torch-universal", version=1, note=note, extra=extra)

    repo.commit(build("initial"), title="Initial build", branch="v1")
    repo.commit(build("weights", {"_weights.bin": weights}), title="Add weights", branch="v1")
    repo.branch("release/v1", "v1")
    repo.commit(build("rebuild", {"_weights.bin": weights}), title="Rebuild", branch="v1")
    return repo


def manifest(path: Path, kernels: dict[str, dict]) -> Path:
    return write_manifest(path, kernels, [X86], trust=[ORG])


@dataclass
class Staged:
    home: Path
    manifests: list[Path]
    rows: list[dict]  # stage --json rows of every manifest, in order
    repos: dict[str, FakeRepo]  # what upstream had (kept in memory after it stopped)
    tripwire: Tripwire


def stage(home: Path, manifests: list[Path], endpoint: str) -> list[dict]:
    rows = []
    for m in manifests:
        p = run_cli("--endpoint", endpoint, "stage", str(m), "--json", home=home)
        assert p.returncode == 0, p.stderr + p.stdout[-2000:]
        rows += json.loads(p.stdout)["rows"]
    return rows
