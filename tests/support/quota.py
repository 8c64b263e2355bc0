"""The tight quota of issue 43, as a user met it: an upstream that allows 8 `/api/` requests in a 10 s
window (the real Hub's headers on every answer, 429 past the quota), and a two-kernel manifest whose
scan needs more API answers than one window holds: `drift` with 9 revisions across v1, v2 and three
pins, each build/ listing several pages long; `steady` with 2."""

from __future__ import annotations

from pathlib import Path

from tests.support.fakehub import FakeHub, FakeRepo, RateLimits
from tests.support.kernel_fixtures import ARM_CPU, ARM_CU, ORG, X86_CPU, X86_CU, build

DRIFT, STEADY = f"{ORG}/drift", f"{ORG}/steady"
TIGHT = RateLimits(api=8, resolvers=3000, window=10)


def quota_repos() -> tuple[list[FakeRepo], list[str]]:
    """The two repos, and the three commits of `drift` the manifest pins: one on v1, one on v2 and one
    that no branch reaches any more (a deleted work branch's), asked for by its sha alone."""
    drift = FakeRepo(DRIFT)
    variants = [X86_CU, X86_CPU, ARM_CU, ARM_CPU, "torch-cpu", "torch-cuda"]  # 18 entries: 4 pages of 5
    shas = [
        drift.commit(build("drift", variants, version=1, note=f"v1.{i}"), title=f"v1 build {i}", branch="v1")
        for i in range(4)
    ]
    drift.branch("v2", "v1")
    shas += [
        drift.commit(build("drift", variants, version=2, note=f"v2.{i}"), title=f"v2 build {i}", branch="v2")
        for i in range(4)
    ]
    drift.branch("main", "v2")
    drift.branch("wip", "v1")
    stray = drift.commit(build("drift", variants, version=1, note="wip"), title="wip build", branch="wip")
    del drift.branches["wip"]
    steady = FakeRepo(STEADY)
    for i in range(2):
        steady.commit(build("steady", ["torch-cpu"], version=1, note=f"{i}"), title=f"build {i}", branch="v1")
    steady.branch("main", "v1")
    return [drift, steady], [shas[1], shas[6], stray]


def quota_manifest(path: Path, pins: list[str], target: str) -> Path:
    drift = ", ".join(["{ version = 1 }", "{ version = 2 }", *(f'{{ revision = "{p}" }}' for p in pins)])
    kernels = f'"{DRIFT}" = [{drift}]\n"{STEADY}" = {{ version = 1 }}\n'
    path.write_text(f'[[targets]]\ntarget = "{target}"\n\n[kernels]\n{kernels}')
    return path


def quota_hub(limits: RateLimits | None = TIGHT, **kw) -> tuple[FakeHub, list[str]]:
    repos, pins = quota_repos()
    return FakeHub(repos, trusted_orgs=[ORG], page_size=5, rate_limits=limits, **kw), pins
