"""Withdrawals reach every copy (issue 30, items 2 and 3): the connected box stages activation v1 and v2,
writes A, unstages v2 and writes D --since A. The cluster imports A, exports a Hub cache, imports D and
exports into the same folder again: v2 is gone from the cache, not only from the home, so an offline
`get_kernel(version=2)` fails while v1 still loads. Importing the older A again does not bring v2 back
(it says what it skipped); `--allow-rollback` does, as it says.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from frt.mirror.store.home import Home
from frt.mirror.store.records import staged_rows
from tests.support.bundles import import_offline
from tests.support.cli import X86, run_cli, write_manifest
from tests.support.fakehub import FakeHub, FakeRepo
from tests.support.kernel_fixtures import ACTIVATION, ARM_CPU, ORG, RELU, X86_CPU, X86_CU, blob, build, relu_repo
from tests.support.offline import NO_NET, load_offline


def activation() -> FakeRepo:
    repo = FakeRepo(ACTIVATION)
    repo.commit(build("activation", [X86_CU, X86_CPU], version=1, note="v1"), title="v1", branch="v1")
    so2 = {"_activation.abi3.so": blob("activation-v2", 64 * 1024)}
    repo.commit(build("activation", [X86_CPU, ARM_CPU], version=2, note="v2", extra=so2), title="v2", branch="v2")
    repo.branch("main", "v2")
    return repo


@pytest.fixture(scope="module")
def box(tmp_path_factory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("box")
    home, a, d = root / "home", root / "a.tar", root / "d.tar"
    with FakeHub([activation(), relu_repo()], trusted_orgs=[ORG], page_size=5) as hub:
        for version in (1, 2):
            m = write_manifest(root / f"v{version}.toml", {ACTIVATION: {"version": version}}, [X86])
            assert run_cli("--endpoint", hub.url, "stage", str(m), home=home).returncode == 0
        assert run_cli("bundle", str(a), home=home).returncode == 0
        p = run_cli("unstage", f"{ACTIVATION}@v2", home=home)
        assert p.returncode == 0, p.stderr
        assert run_cli("bundle", str(d), "--since", str(a), home=home).returncode == 0
    return SimpleNamespace(home=home, a=a, d=d)


def load(cache: Path, version: int):
    code = f"""
        import kernels
        k = kernels.get_kernel({ACTIVATION!r}, version={version})
        print(k.__name__)
    """
    return load_offline(code, {"HF_HUB_CACHE": str(cache), "HF_HUB_DISABLE_XET": "1"})


def export(home: Path, cache: Path, *extra: str) -> dict:
    p = run_cli("export-cache", str(cache), "--target", X86, "--json", *extra, home=home, wrap=NO_NET)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def versions(home: Path) -> set[str]:
    h = Home(home)
    try:
        return {r.requested for r in staged_rows(h.ledger) if r.repo == ACTIVATION}
    finally:
        h.close()


def test_export_into_the_same_cache_follows_a_withdrawal(box, tmp_path):
    cluster, cache = tmp_path / "cluster", tmp_path / "cache"
    assert import_offline(cluster, box.a).returncode == 0
    export(cluster, cache)
    assert load(cache, 2).returncode == 0 and load(cache, 1).returncode == 0
    repo_dir = cache / f"kernels--{ACTIVATION.replace('/', '--')}"
    v2_commit = (repo_dir / "refs" / "v2").read_text()
    v2_blobs = {p.resolve() for p in (repo_dir / "snapshots" / v2_commit).rglob("*") if p.is_file()}
    v1_blobs = {p.resolve() for p in (repo_dir / "snapshots").rglob("*") if p.is_file()} - v2_blobs

    assert import_offline(cluster, box.d).returncode == 0
    doc = export(cluster, cache)
    assert not (repo_dir / "refs" / "v2").exists() and not (repo_dir / "snapshots" / v2_commit).exists()
    assert doc["removed"] == [{"repo": ACTIVATION, "ref": "v2", "commit": v2_commit}]
    # v2's own blobs (its .so) are gone too; every blob v1 links stays, and no other is left.
    kept = {p.resolve() for p in (repo_dir / "snapshots").rglob("*") if p.is_file()}
    assert v1_blobs <= kept and {p.resolve() for p in (repo_dir / "blobs").iterdir()} == kept
    gone = load(cache, 2)
    assert gone.returncode != 0 and "Version 2 not found" in gone.stderr, gone.stderr
    assert load(cache, 1).returncode == 0


def test_keep_only_adds(box, tmp_path):
    cluster, cache = tmp_path / "cluster", tmp_path / "cache"
    assert import_offline(cluster, box.a).returncode == 0
    export(cluster, cache)
    assert import_offline(cluster, box.d).returncode == 0
    doc = export(cluster, cache, "--keep")
    assert doc["removed"] == []
    assert load(cache, 2).returncode == 0


def test_a_folder_we_never_wrote_is_left_alone(box, tmp_path):
    cluster, cache = tmp_path / "cluster", tmp_path / "cache"
    assert import_offline(cluster, box.a).returncode == 0
    other = cache / "models--someone--else" / "refs"
    other.mkdir(parents=True)
    (other / "main").write_text("0" * 40)
    export(cluster, cache)
    assert (other / "main").read_text() == "0" * 40


def test_an_older_bundle_does_not_bring_back_what_was_withdrawn(box, tmp_path):
    cluster = tmp_path / "cluster"
    assert import_offline(cluster, box.a).returncode == 0
    assert import_offline(cluster, box.d).returncode == 0
    assert versions(cluster) == {"v1"}
    p = import_offline(cluster, box.a, "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert versions(cluster) == {"v1"}
    assert doc["new_rows"] == 0 and [(s["repo"], s["requested"]) for s in doc["skipped"]] == [(ACTIVATION, "v2")]
    p = import_offline(cluster, box.a)
    assert p.returncode == 0 and "skipped 1 staged row(s) withdrawn since" in p.stdout, p.stdout
    assert "--allow-rollback" in p.stdout
    p = import_offline(cluster, box.a, "--allow-rollback", "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["skipped"] == [], p.stderr
    assert versions(cluster) == {"v1", "v2"}


def test_the_box_itself_does_not_take_back_what_it_unstaged(box, tmp_path):
    """The connected box unstaged v2 after writing A: importing A there is a rollback too."""
    import shutil

    home = tmp_path / "box-copy"
    shutil.copytree(box.home, home, symlinks=True)
    p = run_cli("import", str(box.a), "--json", home=home, wrap=NO_NET)
    assert p.returncode == 0, p.stderr
    assert versions(home) == {"v1"} and [s["requested"] for s in json.loads(p.stdout)["skipped"]] == ["v2"]


def test_a_newer_bundle_restages_what_was_withdrawn(tmp_path):
    """Withdrawn, then staged again on the box and carried in a newer bundle: it comes back, no flag needed."""
    root = tmp_path / "box"
    root.mkdir()
    home, cluster = root / "home", tmp_path / "cluster"
    tars = {n: root / f"{n}.tar" for n in ("a", "d", "e")}
    with FakeHub([activation(), relu_repo()], trusted_orgs=[ORG], page_size=5) as hub:
        m = write_manifest(root / "m.toml", {ACTIVATION: {"version": 2}}, [X86])
        assert run_cli("--endpoint", hub.url, "stage", str(m), home=home).returncode == 0
        relu = write_manifest(root / "relu.toml", {RELU: {"version": 1}}, [X86])  # D needs something staged
        assert run_cli("--endpoint", hub.url, "stage", str(relu), home=home).returncode == 0
        assert run_cli("bundle", str(tars["a"]), home=home).returncode == 0
        assert run_cli("unstage", ACTIVATION, home=home).returncode == 0
        assert run_cli("bundle", str(tars["d"]), "--since", str(tars["a"]), home=home).returncode == 0
        assert run_cli("--endpoint", hub.url, "stage", str(m), home=home).returncode == 0
        assert run_cli("bundle", str(tars["e"]), home=home).returncode == 0
    for name in ("a", "d"):
        assert import_offline(cluster, tars[name]).returncode == 0
    assert versions(cluster) == set()
    p = import_offline(cluster, tars["e"], "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["skipped"] == [], p.stderr
    assert versions(cluster) == {"v2"}


def test_a_second_target_into_the_same_cache_keeps_the_first(tmp_path):
    """The folder holds what is staged for every target exported into it: exporting for the CUDA nodes
    after the CPU ones does not take the CPU build away."""
    cu = "torch2.11-cu130-x86_64-linux"
    home, cache = tmp_path / "home", tmp_path / "cache"
    with FakeHub([activation(), relu_repo()], trusted_orgs=[ORG], page_size=5) as hub:
        m = write_manifest(tmp_path / "m.toml", {ACTIVATION: {"version": 1}}, [X86, cu])
        assert run_cli("--endpoint", hub.url, "stage", str(m), home=home).returncode == 0
    export(home, cache)
    p = run_cli("export-cache", str(cache), "--target", cu, "--json", home=home, wrap=NO_NET)
    assert p.returncode == 0 and json.loads(p.stdout)["removed"] == [], p.stderr
    variants = {d.name for d in cache.glob("kernels--*/snapshots/*/build/*")}
    assert variants == {X86_CPU, X86_CU}
    assert load(cache, 1).returncode == 0
