"""`big`, a kernel of several MB per arch variant in files above the LFS threshold, so a kill lands
mid-file: what the stage-fault and PostgreSQL ledger tests stage (the fixtures big_hub and big_manifest in
tests/conftest.py)."""

from __future__ import annotations

from tests.support.fakehub import FakeRepo
from tests.support.kernel_fixtures import ARM_CU, ORG, X86_CPU, blob, build, variant_files

BIG = f"{ORG}/big"


def big_repo() -> FakeRepo:
    """Several MB per variant, in files above the LFS threshold, so a kill lands mid-file."""
    repo = FakeRepo(BIG)
    files = build("big", [], version=1)
    for v in (X86_CPU, ARM_CU, "torch-cuda"):
        extra = {f"_big_{i}.abi3.so": blob(f"big-{v}-{i}", 1_500_000 + 100_000 * i) for i in range(4)}
        files.update(variant_files("big", v, version=1, extra=extra))
    repo.commit(files, title="big", branch="v1")
    return repo
