"""The publisher's own digest (metadata.json `digest`), as `kernels` defines it, checked at stage and
again offline by `verify`: bytes that match what the upstream advertises but not what the publisher
built are refused, recorded verbatim, and never stored."""

from __future__ import annotations

import hashlib
import json

import pytest

from tests.support.cli import X86, run_cli, stage_json, write_manifest
from tests.support.fakehub import FakeHub, FakeRepo
from tests.support.kernel_fixtures import ORG, X86_CPU, blob, variant_files
from tests.support.offline import NO_NET

pytestmark = pytest.mark.hub1

PUB = f"{ORG}/published"
SO = "_published.abi3.so"  # above the LFS threshold: the upstream advertises its sha256
BUILD = f"build/{X86_CPU}"


def repo_with(edit=None, *, digest: bool = True, sigstore: bool = False, depends=None) -> FakeRepo:
    """One commit on v1 with an x86 CPU build; `edit(files)` changes the served files after the
    publisher computed its digest (the upstream's own hashes follow the served bytes)."""
    files = {
        "README.md": b"# published\n",
        "build/": None,
        **variant_files(
            "published",
            X86_CPU,
            version=1,
            note="pub",
            extra={SO: blob("pub", 100_000)},
            digest=digest,
            depends=depends,
        ),
    }
    if sigstore:
        files[f"{BUILD}/metadata.json.sigstore"] = b'{"mediaType": "application/vnd.dev.sigstore.bundle+json"}'
    if edit:
        edit(files)
    repo = FakeRepo(PUB)
    repo.commit(files, title="build", branch="v1")
    return repo


def stage_one(tmp_path, repo: FakeRepo):
    home = tmp_path / "home"
    m = write_manifest(tmp_path / "m.toml", {PUB: {"version": 1}}, [X86])
    with FakeHub([repo], trusted_orgs=[ORG]) as hub:
        p, doc = stage_json(home, m, hub)
    return home, p, doc


def stored(home) -> set[str]:
    return {p.name for p in (home / "store" / "sha256").glob("??/*")}


@pytest.mark.parametrize("path", ["__init__.py", SO], ids=["small-file-git-oid", "lfs-file-sha256"])
def test_bytes_the_upstream_vouches_for_but_the_publisher_did_not_are_refused_and_not_stored(tmp_path, path):
    evil = b"import os  # not what the publisher built\n" if path == "__init__.py" else blob("evil", 100_000)

    def swap(files):
        files[f"{BUILD}/{path}"] = evil

    home, p, doc = stage_one(tmp_path, repo_with(swap))
    assert p.returncode == 1, p.stderr
    [row] = doc["rows"]
    assert row["status"] == "refused" and "publisher's digest" in row["detail"], row
    assert hashlib.sha256(evil).hexdigest() not in stored(home)
    assert not (home / "views" / "local").exists() or not list((home / "views" / "local").rglob(path))
    report = json.loads(run_cli("report", "--json", home=home).stdout)
    assert [r["error"] for r in report] == ["PublisherDigestMismatch"]
    assert report[0]["detail"] == row["detail"]  # verbatim


def test_a_file_the_digest_does_not_list_is_refused_by_kernels_rule(tmp_path):
    def add(files):
        files[f"{BUILD}/extra.py"] = b"print('smuggled')\n"

    home, p, doc = stage_one(tmp_path, repo_with(add))
    assert p.returncode == 1
    assert "Unknown file: extra.py" in doc["rows"][0]["detail"], doc["rows"][0]


def test_a_good_variant_is_staged_and_verify_rechecks_the_digest_offline(tmp_path):
    home, p, doc = stage_one(tmp_path, repo_with(sigstore=True))
    assert p.returncode == 0, p.stderr
    assert doc["rows"][0]["publisher_digest"] is True
    view = next((home / "views" / "local").rglob(f"build/{X86_CPU}"))
    assert (view / "metadata.json.sigstore").is_file(), "the signature travels with the variant"
    v = run_cli("verify", "--json", home=home, wrap=NO_NET)
    assert v.returncode == 0 and json.loads(v.stdout)["no_digest"] == 0, v.stdout
    # A file dropped into a shared view later: verify, offline, says so by kernels' rule.
    (view / "dropped.py").write_text("print('hi')\n")
    v = run_cli("verify", "--json", home=home, wrap=NO_NET)
    assert v.returncode == 1
    assert any("publisher's digest: Unknown file: dropped.py" in x for x in json.loads(v.stdout)["problems"])


def test_a_variant_without_a_digest_is_staged_and_marked(tmp_path):
    home, p, doc = stage_one(tmp_path, repo_with(digest=False))
    assert p.returncode == 0, p.stderr
    assert doc["rows"][0]["publisher_digest"] is False
    human = run_cli("verify", home=home)
    assert human.returncode == 0 and "(1 variant(s) have none)" in human.stdout, human.stdout
    matrix = json.loads(run_cli("matrix", PUB, "--json", home=home).stdout)
    assert [r["no_digest"] for r in matrix["revisions"]] == [[X86_CPU]]
    assert "n = built, with no publisher digest" in run_cli("matrix", PUB, home=home).stdout


def test_metadata_kernels_would_not_load_is_refused_with_its_words(tmp_path):
    home, p, doc = stage_one(tmp_path, repo_with(depends=[{"repo_id": f"{ORG}/other", "version": 1}]))
    assert p.returncode == 1
    [row] = doc["rows"]
    assert row["status"] == "refused" and "unknown field `repo_id`" in row["detail"], row
    assert json.loads(run_cli("report", "--json", home=home).stdout)[0]["error"] == "MetadataInvalid"


def test_a_tampered_metadata_json_is_not_read_as_the_publishers_word(tmp_path):
    repo = repo_with()
    head = repo.branches["v1"]
    path = f"{BUILD}/metadata.json"
    doc = json.loads(repo.commits[head].files[path])
    doc["digest"]["files"]["__init__.py"] = doc["digest"]["files"][SO]  # a forged digest, same listing
    repo.set_file_bytes(head, path, json.dumps(doc).encode())
    home, p, out = stage_one(tmp_path, repo)
    assert p.returncode == 1
    [row] = out["rows"]
    assert row["status"] == "refused" and "git oid" in row["detail"], row
    assert hashlib.sha256(json.dumps(doc).encode()).hexdigest() not in stored(home)


@pytest.mark.parametrize(
    "layout",
    ["as built", "a file missing", "a file added", "a file's bytes changed", "with __pycache__", "renamed"],
)
def test_the_verdict_from_stored_hashes_is_kernels_own_on_the_laid_out_dir(tmp_path, layout):
    """stage and pull-through judge a view by the hashes its blobs were verified by (validate_listing),
    not by re-reading it (validate_variant, kernels' Digest.hash_variant): for every kind of difference
    kernels' rule knows, both give the same violations, word for word."""
    import hashlib as _h

    from frt.resolver.kernel_metadata import parse_metadata, validate_listing, validate_variant

    files = variant_files("published", X86_CPU, version=1, note="pub", extra={SO: blob("pub", 3000)})
    inner = {p[len(BUILD) + 1 :]: data for p, data in files.items()}
    meta = parse_metadata(inner["metadata.json"])
    laid = dict(inner)
    if layout == "a file missing":
        laid.pop(SO)
    elif layout == "a file added":
        laid["extra.py"] = b"# not built by the publisher\n"
    elif layout == "a file's bytes changed":
        laid[SO] = laid[SO][:-1] + b"!"
    elif layout == "with __pycache__":
        laid["__pycache__/x.cpython-311.pyc"] = b"\0cache"
    elif layout == "renamed":
        laid["renamed.so"] = laid.pop(SO)
    for rel, data in laid.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(data)
    listing = {rel: _h.sha256(data).hexdigest() for rel, data in laid.items()}
    reread = validate_variant(meta, tmp_path)
    assert validate_listing(meta, listing) == reread
    assert (reread == []) == (layout in ("as built", "with __pycache__"))
