"""Scan and resolve against the fake Hub, driven through the real huggingface_hub client."""

from __future__ import annotations

import pytest

from frt.resolver.attempts import RetryPolicy
from frt.resolver.hub import HubClient
from frt.resolver.ledger import Ledger
from frt.resolver.repo_ids import pin_variable
from frt.resolver.resolution import KernelUnavailable
from frt.resolver.resolve import resolve
from frt.resolver.scan import scan
from frt.resolver.targets import parse_target
from tests.support.kernel_fixtures import ACTIVATION, ARM_CU, RELU, X86_CPU

pytestmark = pytest.mark.hub1

ARM_CU_TARGET = parse_target("torch2.11-cu130-aarch64-linux")
X86_CPU_TARGET = parse_target("torch2.13-cpu-x86_64-linux")


@pytest.fixture
def ledger(tmp_path, ledger_each):
    """Each test on SQLite and on PostgreSQL."""
    led = Ledger(ledger_each or tmp_path / "ledger.sqlite")
    yield led
    led.close()


@pytest.fixture
def client(hub):
    return HubClient(hub.url, retry=RetryPolicy(attempts=4, base_wait=0.01))


def v1_commits(hub):
    """The activation repo's v1 history, oldest first: initial, rebuild, +aarch64, CUDA-aarch64 dropped."""
    repo = hub.repos[("kernel", ACTIVATION)]
    return [c.sha for c in reversed(repo.history(repo.branches["v1"]))]


def test_scan_records_refs_history_variants_files_and_metadata(hub, client, ledger):
    report = scan(ACTIVATION, hub=client, ledger=ledger)
    assert (report.refs, report.commits, report.commits_scanned) == (5, 6, 6)
    repo = hub.repos[("kernel", ACTIVATION)]
    with ledger.view() as v:
        assert v.versions(ACTIVATION) == {1: repo.branches["v1"], 2: repo.branches["v2"]}
        assert v.commit_for(ACTIVATION, "release/v1") == repo.branches["v1"]
        assert v.commit_for(ACTIVATION, "v1.0.0") == repo.branches["v1"]
        assert v.history(ACTIVATION, repo.branches["v1"]) == list(reversed(v1_commits(hub)))
        titles = {c.sha: c.title for c in v.commits(ACTIVATION)}
        assert titles[repo.branches["v1"]] == "Rebuild CUDA (aarch64 CUDA dropped)"
        head = repo.branches["v2"]
        assert ARM_CU in v.variant_names(ACTIVATION, head)
        files, meta = v.variant(ACTIVATION, head, ARM_CU)
    assert meta["backend"] == {"type": "cuda", "archs": ["8.0", "9.0", "10.0"]}
    by_name = {f.path.rsplit("/", 1)[1]: f for f in files}
    so = by_name["_activation.abi3.so"]
    advertised = repo.commits[head].meta[so.path]
    assert (so.size, so.sha256) == (advertised.size, advertised.sha256)  # LFS: sha256 from the tree
    assert by_name["__init__.py"].sha256 is None and by_name["__init__.py"].git_oid == advertised_oid(
        repo, head, "__init__.py"
    )


def advertised_oid(repo, sha, filename):
    return next(m.oid for p, m in repo.commits[sha].meta.items() if p.endswith(f"{ARM_CU}/{filename}"))


def test_rescan_is_incremental(hub, client, ledger):
    scan(ACTIVATION, hub=client, ledger=ledger)
    hub.reset_log()
    report = scan(ACTIVATION, hub=client, ledger=ledger)
    assert report.commits_scanned == 0
    assert [path.split("?")[0] for _, path, _ in hub.requests] == [f"/api/kernels/{ACTIVATION}/refs"]
    # A new upstream commit: only its history page and its own build listing are fetched.
    repo = hub.repos[("kernel", ACTIVATION)]
    from tests.support.kernel_fixtures import build

    repo.commit(build("activation", [X86_CPU], version=2, note="v2.2"), title="v2: x86 only", branch="v2")
    hub.reset_log()
    report = scan(ACTIVATION, hub=client, ledger=ledger)
    assert report.commits_scanned == 1
    trees = [p for _, p, _ in hub.requests if "/tree/" in p]
    assert len(trees) == 1 and repo.branches["v2"] in trees[0]


def test_identical_metadata_is_fetched_once(hub, client, ledger):
    from tests.support.fakehub import FakeRepo
    from tests.support.kernel_fixtures import build

    # Three commits; the second changes only the README, so its build's metadata.json (whose digest
    # covers the build's files) is byte-identical to the first's: fetched once, by git oid.
    repo = FakeRepo("kernels-test/steady")
    repo.commit(build("steady", ["torch-universal"], version=1, note="a"), title="build", branch="v1")
    repo.commit({"README.md": b"# steady, documented\n"}, title="docs", branch="v1")
    repo.commit(build("steady", ["torch-universal"], version=1, note="b"), title="rebuild", branch="v1")
    hub.add_repo(repo)
    scan(repo.repo_id, hub=client, ledger=ledger)
    gets = [p for m, p, _ in hub.requests if m == "GET" and p.endswith("metadata.json")]
    assert len(gets) == len(set(gets))
    assert sum("torch-universal" in p for p in gets) == 2  # three commits, two distinct files


def test_aarch64_trap_is_explained(hub, client, ledger):
    c1, _c2, c3, c4 = v1_commits(hub)
    with pytest.raises(KernelUnavailable) as err:
        resolve(ACTIVATION, target=ARM_CU_TARGET, ledger=ledger, version=1, hub=client)
    r = err.value.refusal
    assert (r.error, r.commit, r.newest_with_target, r.versions_with_target) == ("NoVariant", c4, c3, (2,))
    msg = str(err.value)
    assert msg.startswith(f"{ACTIVATION} v1 → {c4[:12]} has torch-cpu, torch211-cxx11-cu130-x86_64-linux")
    assert f"none for torch2.11-cu130-aarch64-linux; newest commit on v1 with it: {c3[:12]}; v2 has it" in msg
    # The library's own reasons, verbatim, one line per variant.
    assert "torch211-cxx11-cu130-x86_64-linux: CPU (x86_64) does not match system CPU (aarch64)" in r.detail
    assert "torch-cpu: backend (cpu) does not match system backend (cuda) and is not universal" in r.detail

    # An old commit asked by revision points forward to the newest commit on its line that has it.
    with pytest.raises(KernelUnavailable) as err:
        resolve(ACTIVATION, target=ARM_CU_TARGET, ledger=ledger, revision=c1, hub=client)
    assert err.value.refusal.newest_with_target == c3
    assert f"revision {c1} → {c1[:12]}" in str(err.value)


def test_resolution_picks_the_preferred_variant_with_its_files(hub, client, ledger):
    res = resolve(ACTIVATION, target=ARM_CU_TARGET, ledger=ledger, version=2, hub=client)
    assert res.variant == ARM_CU and res.commit == hub.repos[("kernel", ACTIVATION)].branches["v2"]
    assert sorted(f.path.rsplit("/", 1)[1] for f in res.files) == [
        "__init__.py",
        "_activation.abi3.so",
        "metadata.json",
    ]
    # torch-cuda (noarch) is also accepted, but the arch build is preferred, as kernels does.
    res = resolve(
        ACTIVATION, target=parse_target("torch2.11-cu132-aarch64-linux"), ledger=ledger, version=2, offline=True
    )
    assert res.variant == ARM_CU  # cu130 ≤ cu132, same major


def test_pin_overrides_version_and_revision(hub, client, ledger):
    c1, _c2, c3, _c4 = v1_commits(hub)
    env = {pin_variable(ACTIVATION): c3}
    assert pin_variable(ACTIVATION) == "FRT_KERNEL_REV_KERNELS_TEST_ACTIVATION"
    res = resolve(ACTIVATION, target=ARM_CU_TARGET, ledger=ledger, version=1, hub=client, environ=env)
    assert (res.commit, res.variant, res.request.label) == (c3, ARM_CU, f"pin {c3}")
    res = resolve(ACTIVATION, target=ARM_CU_TARGET, ledger=ledger, revision="v2", hub=client, environ=env)
    assert res.commit == c3
    # A short sha pins too (unambiguous prefix, from the ledger).
    res = resolve(
        ACTIVATION,
        target=X86_CPU_TARGET,
        ledger=ledger,
        version=2,
        offline=True,
        environ={pin_variable(ACTIVATION): c1[:10]},
    )
    assert res.commit == c1


def test_universal_build_is_never_refused(hub, client, ledger):
    for t in ["torch2.11-cu130-aarch64-linux", "torch2.13-rocm71-x86_64-linux", "torch2.13-cpu-x86_64-linux"]:
        res = resolve(RELU, target=parse_target(t), ledger=ledger, version=1, hub=client)
        expected = X86_CPU if t == "torch2.13-cpu-x86_64-linux" else "torch-universal"
        assert res.variant == expected


def test_missing_version_revision_and_repo_are_recorded_refusals(hub, client, ledger):
    with pytest.raises(KernelUnavailable, match="Version 7 not found, available versions: 1, 2"):
        resolve(ACTIVATION, target=X86_CPU_TARGET, ledger=ledger, version=7, hub=client)
    with pytest.raises(KernelUnavailable, match="revision 'nope' not found"):
        resolve(ACTIVATION, target=X86_CPU_TARGET, ledger=ledger, revision="nope", hub=client)
    with pytest.raises(KernelUnavailable, match="repository not found"):
        resolve("kernels-test/missing", target=X86_CPU_TARGET, ledger=ledger, version=1, hub=client)
    errors = sorted((r.repo_id, r.error) for r in ledger.refusals())
    assert errors == [
        (ACTIVATION, "RevisionNotFound"),
        (ACTIVATION, "VersionNotFound"),
        ("kernels-test/missing", "RepoNotFound"),
    ]
    missing = next(r for r in ledger.refusals() if r.error == "RepoNotFound")
    assert "Repository" in missing.detail or "repository" in missing.detail  # upstream's own text kept


def test_repeated_refusal_counts_and_distinct_failures_stay_distinct(hub, client, ledger):
    for _ in range(3):
        with pytest.raises(KernelUnavailable):
            resolve(ACTIVATION, target=ARM_CU_TARGET, ledger=ledger, version=1, hub=client)
    with pytest.raises(KernelUnavailable):
        resolve(
            ACTIVATION, target=parse_target("torch2.12-cu130-aarch64-linux"), ledger=ledger, version=1, offline=True
        )
    rows = ledger.refusals()
    assert sorted((r.target, r.count) for r in rows) == [
        ("torch2.11-cu130-aarch64-linux", 3),
        ("torch2.12-cu130-aarch64-linux", 1),
    ]


def test_offline_resolve_uses_the_ledger_only(hub, client, ledger):
    scan(ACTIVATION, hub=client, ledger=ledger)
    hub.stop()
    res = resolve(ACTIVATION, target=X86_CPU_TARGET, ledger=ledger, version=1, offline=True)
    assert res.variant == X86_CPU


def test_flaky_upstream_is_retried(hub, client, ledger):
    hub.faults.fail_next(3, status=503, match="/refs")
    report = scan(ACTIVATION, hub=client, ledger=ledger)
    assert report.commits == 6
    statuses = [s for _, p, s in hub.requests if p.endswith("/refs")]
    assert statuses == [503, 503, 503, 200]


def test_a_long_lived_client_keeps_a_bounded_number_of_publisher_answers(hub, monkeypatch):
    """A serve's HubClient lives for months and, under `--allow '*'`, meets orgs without end: it keeps the
    newest PUBLISHERS_KEPT overview answers and asks again for one it forgot (it kept every org's before)."""
    import frt.resolver.hub as hub_module

    monkeypatch.setattr(hub_module, "PUBLISHERS_KEPT", 2)
    client = HubClient(hub.url, retry=RetryPolicy(attempts=2, base_wait=0.01))
    hub.reset_log()
    for org in ("kernels-test", "org-b", "org-c", "org-c", "kernels-test"):
        client.publisher_trusted(org)
    asked = [r.path.split("/")[3] for r in hub.request_log if r.path.endswith("/overview")]
    assert asked == ["kernels-test", "org-b", "org-c", "kernels-test"], asked
