"""The gate where data enters: what upstream, a bundle or a ledger hands us is refused in one line
before it becomes a path, a ref or a row; nothing lands outside the home (or the export dir).

A hostile upstream is the fake Hub with raw entries put into its repo model: a file path with
`..`, a branch named `../../x`, a branch whose target is not a commit id.
"""

from __future__ import annotations

import posixpath
import sqlite3
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from frt.manifests import fields
from frt.resolver import gate
from frt.resolver.errors import EXIT_BAD_INPUT, BadInput, exit_code
from tests.support.bundles import edit_manifest, import_offline, rewrite, snapshot
from tests.support.cli import X86, run_cli, write_manifest
from tests.support.fakehub import FakeHub
from tests.support.kernel_fixtures import ORG, RELU, X86_CPU, demo_repos

pytestmark = pytest.mark.hub1


# -- the gate's checks, one by one ---------------------------------------------------------------

WHERE = "upstream listing of org/name@abc123"


def test_a_refusal_is_one_line_naming_the_value_and_where_it_came_from():
    with pytest.raises(gate.UnsafePath) as e:
        gate.check_path("build/v/../../x", where=WHERE)
    assert str(e.value) == f"{WHERE}: path 'build/v/../../x' climbs out of the repo"
    assert isinstance(e.value, BadInput) and exit_code(e.value) == EXIT_BAD_INPUT


@pytest.mark.parametrize(
    "path", ["build/v/a.py", "build/v/sub/__init__.py", "build/v/é.so", "build/v/.gitkeep", "build/v/" + "a" * 255]
)
def test_plain_paths_pass(path):
    assert gate.check_path(path, where=WHERE, under="build/v/") == path


@pytest.mark.parametrize(
    "path, says",
    [
        ("build/v/../../x", "climbs out of the repo"),
        ("..", "climbs out"),
        ("/etc/passwd", "is absolute"),
        ("build\\v\\x", "backslash"),
        ("build/v/\0x", "control character"),
        ("build/v/\nx", "control character"),
        ("build/v/\x1bx", "control character"),
        ("build/v/\x85x", "control character"),
        ("build//x", "empty or '.' segment"),
        ("build/./x", "empty or '.' segment"),
        ("build/v/", "empty or '.'"),
        ("", "is empty"),
        (None, "is not a string"),
        ("build/\udc80", "is not valid text"),
        ("build/" + "a" * 256, "too long"),
        ("/".join(["abcdefgh"] * 120), "too long"),
        ("other/x", "lies outside build/"),
        # Unicode format characters (Cf): a bidi override makes `x\u202eos.py` read as `xyp.so` in a listing.
        ("build/v/x\u202eos.py", "bidi"),
        ("build/v/\u2066a\u2069", "bidi"),
        ("build/v/a\u200bb", "bidi"),
        ("build/v/\ufeffa", "bidi"),
        ("build/v/a\u200fb", "bidi"),
    ],
)
def test_unsafe_paths_are_refused(path, says):
    with pytest.raises(gate.UnsafePath) as e:
        gate.check_path(path, where=WHERE, under="build/")
    assert says in str(e.value) and str(e.value).startswith(f"{WHERE}: path {path!r}")
    assert "\n" not in str(e.value)


_SEGMENTS = st.sampled_from(
    [
        "build",
        "v",
        "a.so",
        ".",
        "..",
        "",
        "...",
        "a b",
        "x\\y",
        "\0",
        "\n",
        "é",
        "a" * 256,
        "-x",
        ".lock",
        "x.lock",
        "@{",
        "~",
        "\udc80",
    ]
)
_PATHS = st.one_of(
    st.text(max_size=30),
    st.builds(
        lambda lead, parts: lead + "/".join(parts),
        st.sampled_from(["", "/", "//"]),
        st.lists(_SEGMENTS, min_size=1, max_size=6),
    ),
)


def _stays_inside(name: str, root: str = "/srv/home/views") -> bool:
    """Joined under `root` the way the mirror joins (pathlib / os.path), where does it point?"""
    joined = posixpath.normpath(posixpath.join(root, name))
    return (
        joined.startswith(root + "/")
        and "\\" not in name  # Windows would split on it
        and all(len(p.encode()) <= 255 for p in name.split("/"))
    )


@given(_PATHS)
@example("build/v/../../x")
@example("build/v/..")
def test_every_accepted_path_stays_inside_its_root(path):
    if gate.path_problem(path) is None:
        assert _stays_inside(path), path
        assert Path("/srv/home", path).resolve().is_relative_to("/srv/home")


@given(_PATHS)
@example("../../x")
def test_every_accepted_ref_name_stays_inside_refs(name):
    if gate.ref_problem(name) is None:
        assert _stays_inside(name, "/cache/refs"), name


@pytest.mark.parametrize("sha", ["a" * 40, "0123456789abcdef" * 2 + "01234567"])
def test_commit_ids_are_40_lowercase_hex(sha):
    assert gate.check_commit(sha, where=WHERE) == sha


@pytest.mark.parametrize(
    "sha", ["A" * 40, "a" * 39, "a" * 41, "g" * 40, "a" * 40 + "\n", "", None, 40, "../" + "a" * 37]
)
def test_other_commit_ids_are_refused(sha):
    with pytest.raises(gate.BadCommitId, match="is not a commit id"):
        gate.check_commit(sha, where=WHERE)


@pytest.mark.parametrize(
    "name", ["main", "v1", "release/v1", "v1.0.0", "refs/heads/main", "feat_x-y", "a" * 255, "a" * 40, "ü/ñ"]
)
def test_git_ref_names_pass(name):
    assert gate.check_ref(name, where="upstream refs of org/name") == name


@pytest.mark.parametrize(
    "name, says",
    [
        ("../../x", "'..'"),
        ("a/../b", "'..'"),
        ("a..b", "'..'"),
        ("/main", "starts with '/'"),
        ("-x", "starts with '-'"),
        ("main/", "ends with '/'"),
        ("a//b", "'//'"),
        ("x.lock", "'.lock'"),
        ("a.lock/b", "'.lock'"),
        ("a.", "ends with '.'"),
        (".hidden", "starting with '.'"),
        ("a/.b", "starting with '.'"),
        ("a\\b", "character"),
        ("a b", "character"),
        ("a~1", "character"),
        ("a^", "character"),
        ("a:b", "character"),
        ("a?", "character"),
        ("a*", "character"),
        ("a[", "character"),
        ("ma\0in", "character"),
        ("ma\x7fin", "character"),
        ("@", "'@{' or is '@'"),
        ("a@{b", "'@{'"),
        ("", "is empty"),
        ("a" * 256, "too long"),
        ("/".join(["abcdefgh"] * 120), "too long"),
        (5, "not a string"),
        ("v1\u202e", "character"),
        ("\u2067main", "character"),
    ],
)
def test_ref_names_git_refuses_are_refused(name, says):
    with pytest.raises(gate.BadRefName) as e:
        gate.check_ref(name, where="upstream refs of org/name", what="branch name")
    assert says in str(e.value) and str(e.value).startswith(f"upstream refs of org/name: branch name {name!r}")


@pytest.mark.parametrize("repo", ["kernels-community/activation", "org/name.v2", "_x/y_", "a/b"])
def test_repo_ids_pass(repo):
    assert gate.check_repo_id(repo) == repo and gate.repo_id_problem(repo) is None


@pytest.mark.parametrize(
    "repo",
    [
        "../../etc",
        "org/..",
        "org/a..b",
        "org--x/y",
        "a/b/c",
        "org/",
        "/name",
        "not a repo",
        "org/" + "a" * 97,
        "org/-x",
        "org/x.",
        None,
    ],
)
def test_malformed_repo_ids_are_refused_in_both_wordings(repo):
    with pytest.raises(gate.BadRepoId, match="^malformed repo id"):
        gate.check_repo_id(repo)
    with pytest.raises(gate.BadRepoId, match="^bundle: malformed repo id"):
        gate.check_repo_id(repo, where="bundle")
    assert "is not a repo id" in gate.repo_id_problem(repo)


def test_the_manifests_repo_id_rule_is_the_gates():
    """frt.manifests imports nothing of ours, so it states the rule and the gate calls it: one rule."""
    assert gate.repo_id_problem is fields.repo_id_problem and gate.org_problem is fields.org_problem


@pytest.mark.parametrize(
    "name, ok",
    [
        ("torch-universal", True),
        (X86_CPU, True),
        ("torch-cuda", True),
        ("..", False),
        (".", False),
        ("a/b", False),
        ("", False),
        (".hidden", False),
        ("a..b", False),
        ("v\n", False),
        (None, False),
    ],
)
def test_variant_names_are_one_plain_directory(name, ok):
    if ok:
        assert gate.check_variant(name, where=WHERE) == name
    else:
        with pytest.raises(gate.BadVariantName, match="is not one plain directory name"):
            gate.check_variant(name, where=WHERE)


@pytest.mark.parametrize("digest, ok", [("ab" * 32, True), ("AB" * 32, False), ("ab" * 31, False), ("", False)])
def test_sha256_digests_are_64_lowercase_hex(digest, ok):
    if ok:
        assert gate.check_sha256(digest, where=WHERE) == digest
    else:
        with pytest.raises(gate.BadCommitId, match="is not a sha256"):
            gate.check_sha256(digest, where=WHERE)


# -- where data enters: a hostile upstream, a forged bundle, a damaged ledger ---------------------


def _hostile_listing(repo):
    repo.commit({f"build/{X86_CPU}/../../x": b"evil"}, title="Escape", branch="v1")


def _hostile_bidi_name(repo):
    repo.commit({f"build/{X86_CPU}/_ops\u202eos.py": b"evil"}, title="Bidi", branch="v1")


def _hostile_ref_name(repo):
    repo.branches["../../x"] = repo.branches["v1"]


def _hostile_target_commit(repo):
    repo.branches["v1"] = "not-a-commit/../../x"


# The fake Hub lists the implied directories too (build/<variant>/..): whichever comes first is named.
HOSTILE = [
    (_hostile_listing, f"'build/{X86_CPU}/.."),
    (_hostile_ref_name, "'../../x'"),
    (_hostile_target_commit, "'not-a-commit/../../x'"),
    (_hostile_bidi_name, "bidi"),
]
HOSTILE_IDS = ["listing-path", "ref-name", "target-commit", "listing-bidi"]


def _outside(root: Path, home: Path) -> set[Path]:
    """Every path under `root` but the home's own tree."""
    return {p for p in root.rglob("*") if home not in (p, *p.parents)}


def _ledger_rows(home: Path, sql: str) -> list:
    if not (home / "ledger.sqlite").exists():
        return []
    with sqlite3.connect(home / "ledger.sqlite") as db:
        return db.execute(sql).fetchall()


@pytest.mark.parametrize("command", ["stage", "scan"])
@pytest.mark.parametrize("poison, says", HOSTILE, ids=HOSTILE_IDS)
def test_hostile_upstream_is_refused_in_one_line(tmp_path, poison, says, command):
    repos = demo_repos()
    poison(next(r for r in repos if r.repo_id == RELU))
    home = tmp_path / "home"
    manifest = write_manifest(tmp_path / "frt-manifest.toml", {RELU: {"version": 1}}, [X86])
    before = _outside(tmp_path, home)
    args = ("stage", str(manifest)) if command == "stage" else ("scan", RELU, "--json")  # no progress lines
    with FakeHub(repos, trusted_orgs=[ORG]) as hub:
        p = run_cli("--endpoint", hub.url, *args, home=home)
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert says in lines[0] and RELU in lines[0] and "upstream" in lines[0], lines[0]
    assert _outside(tmp_path, home) == before  # nothing beside the home
    assert not (home / "views" / "local" / f"{ORG}--relu").exists()  # no view for it
    assert not _ledger_rows(home, "SELECT * FROM staged")
    assert not _ledger_rows(home, "SELECT name FROM refs WHERE name LIKE '%..%' OR commit_sha LIKE '%..%'")
    assert not _ledger_rows(home, "SELECT path FROM files WHERE path LIKE '%..%'")


def _staged_variant(doc) -> dict:
    row = doc["staged"][0]
    repo = next(r for r in doc["repos"] if r["repo"] == row["repo"])
    commit = next(c for c in repo["commits"] if c["sha"] == row["commit"])
    return next(v for v in commit["variants"] if v["name"] == row["variant"])


def _ref_with_dots(doc):
    doc["repos"][0]["refs"].append({"kind": "branch", "name": "../../x", "commit": doc["staged"][0]["commit"]})


def _path_with_dots(doc):
    v = _staged_variant(doc)
    v["files"][0]["path"] = f"build/{v['name']}/a/../b"


def _commit_not_hex(doc):
    doc["repos"][0]["refs"][0]["commit"] = "../" + "a" * 37


@pytest.mark.parametrize(
    "edit, says",
    [
        (edit_manifest(_ref_with_dots), "'../../x'"),
        (edit_manifest(_path_with_dots), "/a/../b'"),
        (edit_manifest(_commit_not_hex), "'../" + "a" * 37 + "'"),
    ],
    ids=["ref-name", "file-path", "commit"],
)
def test_forged_bundle_is_refused_and_nothing_is_written(home_a, b_with_x86, tmp_path, edit, says):
    bad = tmp_path / "forged.tar"
    rewrite(home_a.full, bad, edit)
    before, beside = snapshot(b_with_x86), _outside(tmp_path, b_with_x86)
    p = import_offline(b_with_x86, bad)
    assert p.returncode == 1, (p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert says in lines[0] and "nothing was imported" in lines[0], lines[0]
    assert snapshot(b_with_x86) == before
    assert _outside(tmp_path, b_with_x86) == beside


def test_export_cache_refuses_a_hostile_ref_from_the_ledger(tmp_path):
    home, out = tmp_path / "home", tmp_path / "cache"
    manifest = write_manifest(tmp_path / "frt-manifest.toml", {RELU: {"revision": "v1"}}, [X86])
    with FakeHub(demo_repos(), trusted_orgs=[ORG]) as hub:
        p = run_cli("--endpoint", hub.url, "stage", str(manifest), home=home)
    assert p.returncode == 0, p.stderr
    with sqlite3.connect(home / "ledger.sqlite") as db:  # as a damaged or hand-edited ledger would say
        assert db.execute("UPDATE staged SET revision = '../../../escaped'").rowcount == 1
    before = _outside(tmp_path, home)
    p = run_cli("export-cache", str(out), "--target", X86, home=home)
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "'../../../escaped'" in lines[0] and "ledger" in lines[0], p.stderr
    assert {q for q in _outside(tmp_path, home) if out not in (q, *q.parents)} == before - {out}
    assert not (tmp_path / "escaped").exists()
    assert not out.exists() or not any(out.rglob("*"))  # checked before anything is written
