"""Incremental bundles, as an operator carries a new kernel version across the gap.

The connected box stages activation v1 and relu v1 and writes bundle A; the upstream publishes
activation v2, the box stages it and writes B `--since A` (and, for comparison, a full bundle of the
same set). A cluster that imports A then B holds exactly what one that imported the full bundle holds;
B alone is refused and changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from frt.mirror.store.home import Home
from frt.mirror.store.records import all_blobs, staged_rows
from frt.resolver.ledger.io import repo_record
from tests.support.bundles import edit_manifest, import_offline, rewrite, snapshot_data
from tests.support.cli import ARM_CU, X86, run_cli, write_manifest
from tests.support.fakehub import FakeHub, FakeRepo
from tests.support.homes import empty_home
from tests.support.kernel_fixtures import (
    ACTIVATION,
    ARM_CPU,
    ORG,
    RELU,
    X86_CPU,
    X86_CU,
    blob,
    build,
    relu_repo,
)
from tests.support.offline import NO_NET, load_offline


def activation_v1() -> FakeRepo:
    repo = FakeRepo(ACTIVATION)
    so = {"_activation.abi3.so": blob("activation-v1", 96 * 1024)}
    v1 = [X86_CU, X86_CPU, "torch-cpu"]
    repo.commit(build("activation", v1, version=1, note="initial", extra=so), title="Initial build", branch="v1")
    repo.commit(build("activation", v1, version=1, note="rebuild", extra=so), title="Rebuild", branch="v1")
    repo.branch("main", "v1")
    return repo


def publish_v2(repo: FakeRepo) -> None:
    """The upstream's new kernel version: a v2 branch (two commits) and main moved to it."""
    so2 = {"_activation.abi3.so": blob("activation-v2", 128 * 1024)}
    v2 = [X86_CU, X86_CPU, ARM_CPU, "torch-cpu", "torch-cuda"]
    repo.commit(build("activation", v2, version=2, note="v2", extra=so2), title="v2: new API", branch="v2")
    repo.commit(build("activation", v2, version=2, note="v2.1", extra=so2), title="v2: faster", branch="v2")
    repo.branch("main", "v2")


def bundle(home: Path, out: Path, *extra: str) -> dict:
    p = run_cli("bundle", str(out), "--json", *extra, home=home)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def manifest_of(tar: Path) -> tuple[bytes, dict]:
    with tarfile.open(tar) as tf:
        data = tf.extractfile("frt-bundle.json").read()
    return data, json.loads(data)


def stage(home: Path, root: Path, hub, kernels: dict, targets: list[str]) -> None:
    m = write_manifest(root / "m.toml", kernels, targets)
    p = run_cli("--endpoint", hub.url, "stage", str(m), "--json", home=home)
    assert p.returncode == 0, p.stderr


@pytest.fixture(scope="module")
def box(tmp_path_factory) -> SimpleNamespace:
    """The connected box's home and the bundles it wrote: A (full), B --since A, full_b (the same set as
    A+B, in full), then C --since B after a second target, and full_c."""
    root = tmp_path_factory.mktemp("box")
    home, act = root / "home", activation_v1()
    t = {n: root / f"{n}.tar" for n in ("a", "b", "full_b", "c", "full_c")}
    with FakeHub([act, relu_repo()], trusted_orgs=[ORG], page_size=5) as hub:
        stage(home, root, hub, {ACTIVATION: {"version": 1}, RELU: {"version": 1}}, [X86])
        docs = {"a": bundle(home, t["a"])}
        publish_v2(act)
        stage(home, root, hub, {ACTIVATION: {"version": 2}}, [X86])
        docs["b"] = bundle(home, t["b"], "--since", str(t["a"]))
        docs["full_b"] = bundle(home, t["full_b"])
        stage(home, root, hub, {ACTIVATION: {"version": 2}}, [ARM_CU])  # a second target: torch-cuda
        docs["c"] = bundle(home, t["c"], "--since", str(t["b"]))
        docs["full_c"] = bundle(home, t["full_c"])
    return SimpleNamespace(home=home, tar=t, doc=docs)


def contents(home: Path) -> dict:
    """What an import leaves in a home, to compare two homes: the ledger's rows as a bundle reads them
    (every repo's record, the staged rows, the blobs, the publishers), and every stored and viewed byte.
    Not compared: when rows were written (the import's own time) and the events log."""
    h = Home(home)
    try:
        ledger = h.ledger
        with ledger.view() as v:
            repos = sorted(r for r in (ACTIVATION, RELU) if v.known(r))
        rows = {
            "repos": [repo_record(ledger, r) for r in repos],
            "staged": staged_rows(ledger),
            "blobs": all_blobs(ledger),
            "publishers": ledger.publishers(),
        }
    finally:
        h.close()
    files = {}
    # The blobs and views; not store/records/ (each says when it was written, and an incremental import
    # leaves tombstones of what it took away: tests/test_ledger_rebuild.py reads them back)
    for sub in ("store/sha256", "views"):
        for p in sorted((home / sub).rglob("*")):
            if p.is_file():
                files[str(p.relative_to(home))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return {"rows": rows, "files": files}


def test_incremental_carries_only_what_is_new(box):
    a, b, full = box.doc["a"], box.doc["b"], box.doc["full_b"]
    a_bytes, a_doc = manifest_of(box.tar["a"])
    _, b_doc = manifest_of(box.tar["b"])
    _, full_doc = manifest_of(box.tar["full_b"])
    assert box.tar["b"].stat().st_size < box.tar["full_b"].stat().st_size and b["bytes"] < full["bytes"]
    assert b["base"] == a["id"] == hashlib.sha256(a_bytes).hexdigest() and b_doc["base"]["name"] == "a.tar"
    assert b_doc["base"]["id"] == a["id"] and b_doc["format"] == 3 and "base" not in a_doc
    # Blobs: exactly those the full bundle has and A has not.
    shas = {x: {d["sha256"] for d in doc["blobs"]} for x, doc in (("a", a_doc), ("b", b_doc), ("f", full_doc))}
    assert shas["b"] == shas["f"] - shas["a"] and shas["b"]
    # Records: relu did not change, so B does not name it; of activation only v2's commits and rows.
    assert [r["repo"] for r in b_doc["repos"]] == [ACTIVATION]
    assert {s["requested"] for s in b_doc["staged"]} == {"v2"} and len(b["staged"]) == 1
    a_commits = {c["sha"] for r in a_doc["repos"] for c in r["commits"]}
    b_commits = {c["sha"] for c in b_doc["repos"][0]["commits"]}
    assert b_commits and not b_commits & a_commits
    # The upstream's trust answer was seen again by the second stage: carried, being newer than A's.
    assert b_doc["publishers"] == full_doc["publishers"] and b_doc["publishers"] != a_doc["publishers"]


@pytest.mark.parametrize("chain", [("a", "b"), ("a", "b", "c")], ids=["A+B", "A+B+C"])
def test_imported_in_order_equals_a_full_import(box, tmp_path, chain):
    inc, full = tmp_path / "inc", tmp_path / "full"
    for name in chain:
        p = import_offline(inc, box.tar[name], "--json")
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout)["base"] == box.doc[name]["base"]
    last = "full_b" if chain[-1] == "b" else "full_c"
    assert import_offline(full, box.tar[last]).returncode == 0
    got, want = contents(inc), contents(full)
    assert got["files"] and got["files"] == want["files"]
    assert got["rows"] == want["rows"]
    assert run_cli("verify", home=inc, wrap=NO_NET).returncode == 0

    p = run_cli("env", "--target", X86, "--format", "json", "--version", f"{ACTIVATION}=2", home=inc, wrap=NO_NET)
    assert p.returncode == 0, p.stderr
    out = load_offline(
        f"""
        import kernels
        act = kernels.get_kernel({ACTIVATION!r}, version=2)
        relu = kernels.get_kernel({RELU!r}, version=1)
        print(act.VARIANT, act.VERSION, act.add(2, 3), relu.VARIANT)
    """,
        json.loads(p.stdout)["env"],
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [X86_CPU, "2", "5", X86_CPU]


def test_incremental_alone_is_refused_and_nothing_is_written(box, tmp_path):
    fresh = tmp_path / "fresh"
    empty_home(fresh)
    before = snapshot_data(fresh)
    p = import_offline(fresh, box.tar["b"])
    assert p.returncode == 1, p.stderr
    line = p.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, p.stderr
    assert f"base a.tar (id {box.doc['a']['id'][:12]}" in line and "it was never imported here" in line
    assert "blob(s)" in line and "import the base first" in line and "nothing was imported" in line
    assert snapshot_data(fresh) == before

    # C needs B's base (A) as much as B: a home that holds A but not B refuses C too.
    assert import_offline(fresh, box.tar["a"]).returncode == 0
    before = snapshot_data(fresh)
    p = import_offline(fresh, box.tar["c"])
    assert p.returncode == 1 and "base b.tar" in p.stderr and "nothing was imported" in p.stderr, p.stderr
    assert snapshot_data(fresh) == before


def test_a_base_that_lost_a_blob_is_not_held(box, tmp_path):
    """The log says A was imported, the store says one of its blobs is gone: the store decides."""
    home = tmp_path / "b"
    assert import_offline(home, box.tar["a"]).returncode == 0
    victim = max((p for p in (home / "store").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    victim.unlink()
    before = snapshot_data(home)
    p = import_offline(home, box.tar["b"])
    assert p.returncode == 1, p.stderr
    assert re.search(r"it was imported here at \d{4}-\d\d-\d\d \d\d:\d\d but is no longer whole", p.stderr)
    assert "1 blob(s), e.g. " in p.stderr and snapshot_data(home) == before


def test_a_home_that_holds_the_base_without_importing_it_takes_the_incremental(box, tmp_path):
    """The base is judged by contents: the box that wrote A, and a home that imported a full bundle
    of A's set or more, both hold it though neither imported A."""
    full = tmp_path / "full"
    assert import_offline(full, box.tar["full_b"]).returncode == 0
    p = import_offline(full, box.tar["b"], "--json")
    assert p.returncode == 0, p.stderr
    assert (json.loads(p.stdout)["new_blobs"], json.loads(p.stdout)["new_rows"]) == (0, 0)

    writer = tmp_path / "writer"
    # The box's own home as it was after writing A, B and C (cp -a: views stay hard links to the store).
    subprocess.run(["cp", "-a", str(box.home), str(writer)], check=True)
    p = run_cli("import", str(box.tar["b"]), "--json", home=writer)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["new_blobs"] == 0
    assert run_cli("verify", home=writer).returncode == 0


def test_since_must_name_a_bundle(box, tmp_path):
    junk = tmp_path / "junk.tar"
    junk.write_bytes(os.urandom(2048))
    p = run_cli("bundle", str(tmp_path / "x.tar"), "--since", str(junk), home=box.home)
    assert p.returncode == 2 and "--since" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not (tmp_path / "x.tar").exists()


def test_what_the_box_unstaged_the_cluster_unstages(tmp_path):
    """The box stages activation and relu, writes A, unstages relu and writes D --since A: D names relu's
    row as a removal (format 4, which an older frt-mirror refuses rather than keep what was withdrawn).
    A cluster that imports A then D stages and views what a fresh full import of the box's set does, and
    after gc stores the same; a rerun of D is not refused and changes nothing; E --since D carries no
    removal again. A removal its base never held is refused, and nothing is written."""
    root, cluster, fresh = tmp_path / "box", tmp_path / "cluster", tmp_path / "fresh"
    root.mkdir()
    home = root / "home"
    tar = {n: root / f"{n}.tar" for n in ("a", "d", "e", "full")}
    with FakeHub([activation_v1(), relu_repo()], trusted_orgs=[ORG], page_size=5) as hub:
        stage(home, root, hub, {ACTIVATION: {"version": 1}, RELU: {"version": 1}}, [X86])
        h = Home(home)
        relu_rows = [[r.repo, r.requested, r.target] for r in staged_rows(h.ledger) if r.repo == RELU]
        h.close()
        bundle(home, tar["a"])
        assert run_cli("unstage", RELU, home=home).returncode == 0
        d = bundle(home, tar["d"], "--since", str(tar["a"]))
        bundle(home, tar["full"])
        e = bundle(home, tar["e"], "--since", str(tar["d"]))
    assert relu_rows
    _, d_doc = manifest_of(tar["d"])
    assert d_doc["format"] == 4 and d_doc["unstaged"] == relu_rows
    assert d["unstaged"] == [dict(zip(("repo", "requested", "target"), k, strict=False)) for k in relu_rows]
    _, e_doc = manifest_of(tar["e"])
    assert e_doc["format"] == 3 and "unstaged" not in e_doc and e["unstaged"] == []

    assert import_offline(cluster, tar["a"]).returncode == 0
    assert [p for p in (cluster / "views").rglob("*") if "relu" in p.name]
    p = import_offline(cluster, tar["d"])
    assert p.returncode == 0 and f"unstaged {len(relu_rows)} row(s)" in p.stdout, p.stdout + p.stderr
    assert not [p for p in (cluster / "views").rglob("*") if "relu" in p.name]
    assert run_cli("verify", home=cluster, wrap=NO_NET).returncode == 0
    p = import_offline(cluster, tar["d"], "--json")
    assert p.returncode == 0, p.stderr
    assert (json.loads(p.stdout)["new_rows"], json.loads(p.stdout)["unstaged"]) == (0, [])
    assert import_offline(cluster, tar["e"]).returncode == 0

    assert import_offline(fresh, tar["full"]).returncode == 0
    assert run_cli("gc", home=cluster, wrap=NO_NET).returncode == 0  # relu's blobs: nothing references them
    got, want = contents(cluster), contents(fresh)
    assert got["rows"]["staged"] == want["rows"]["staged"] and got["files"] == want["files"]

    # A forger's removal of what the base never held: refused in one line, nothing written.
    other = tmp_path / "other"
    assert import_offline(other, tar["a"]).returncode == 0
    forged = tmp_path / "forged.tar"
    rewrite(tar["d"], forged, edit_manifest(lambda doc: doc["unstaged"].append([ACTIVATION, "v9", X86])))
    before = snapshot_data(other)
    p = import_offline(other, forged)
    assert p.returncode == 1 and "is not in the base" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert snapshot_data(other) == before
