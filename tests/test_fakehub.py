"""The fake Hub judged by the real clients: huggingface_hub in-process, kernels in a subprocess.

If these pass, tests that use FakeHub as "upstream" exercise the same wire behaviour as the real Hub
(pagination, slash revisions, X-Error-Code mapping, LFS headers, ranges), not a friendly echo.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from huggingface_hub import HfApi, hf_hub_download, snapshot_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from tests.support.fakehub import FakeHub, git_blob_oid, sha256
from tests.support.tinyadd import (
    BIG,
    CUDA,
    NAME,
    ORG,
    PAGE,
    REPO_ID,
    UNIV,
    build_repo,
    run_get_kernel,
    stop_mid_body,
    universal_files,
)

pytestmark = pytest.mark.hub1


@pytest.fixture
def hub():
    repo, _ = build_repo()
    with FakeHub([repo], trusted_orgs=[ORG], page_size=PAGE) as h:
        yield h


@pytest.fixture
def api(hub):
    return HfApi(endpoint=hub.url, token=False)


def get(url: str, headers: dict | None = None):
    return urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10)


# -- repo model ------------------------------------------------------------------------------------


def test_repo_model_basics():
    r, shas = build_repo()
    assert r.resolve_ref("release/v1") == shas["cuda"]
    assert r.resolve_ref("v1.0") == r.branches["v1"] == shas["v1"]
    assert r.resolve_ref(shas["root"]) == shas["root"] and r.resolve_ref("nope") is None
    assert [c.title for c in r.history(shas["v1"])][-2:] == ["add universal build", "initial commit"]
    v2 = r.commits[shas["v2"]]
    assert not any(p.startswith(CUDA) for p in v2.files) and f"{UNIV}/__init__.py" in v2.files
    assert git_blob_oid(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"  # git hash-object /dev/null
    assert build_repo()[1] == shas  # deterministic shas


# -- API routes through the real client -----------------------------------------------------------


def test_refs_and_slash_branch(hub, api):
    refs = api.list_repo_refs(REPO_ID, repo_type="kernel")
    assert {b.name for b in refs.branches} == {"main", "v1", "v2", "release/v1"}
    assert {t.name: t.target_commit for t in refs.tags} == {"v1.0": hub.repos[("kernel", REPO_ID)].branches["v1"]}
    assert api.list_repo_refs(REPO_ID, repo_type="kernel", include_pull_requests=True).pull_requests == []
    info = api.repo_info(REPO_ID, revision="release/v1", repo_type="kernel")
    assert info.sha == build_repo()[1]["cuda"]
    assert any("/revision/release%2Fv1" in p for _, p, _ in hub.requests)


def test_tree_pagination(hub, api):
    repo = hub.repos[("kernel", REPO_ID)]
    head = repo.commits[repo.branches["v1"]]
    hub.reset_log()
    entries = api.list_repo_tree(REPO_ID, repo_type="kernel", revision="v1", recursive=True)
    got = {e.path: e for e in entries}
    assert set(got) == set(head.files) | head.dirs()
    assert len(got) > 2 * PAGE
    cursors = [p for m, p, s in hub.requests if "/tree/" in p and "cursor=" in p]
    assert len(cursors) >= 2 and all("recursive=true" in p for p in cursors)
    # LFS file: content hash under lfs, pointer blob id as oid (as on the Hub); small file: blob oid.
    big = got["weights.bin"]
    assert big.lfs.sha256 == sha256(BIG) and big.lfs.size == big.size == len(BIG)
    assert big.blob_id != git_blob_oid(BIG)
    assert got["README.md"].blob_id == git_blob_oid(head.files["README.md"]) and got["README.md"].lfs is None
    # non-recursive subdir listing (path arrives as build%2F...), and expand=True adds lastCommit
    sub = list(api.list_repo_tree(REPO_ID, path_in_repo="build", repo_type="kernel", revision="v1", expand=True))
    assert [e.path for e in sub] == [UNIV, CUDA]  # sorted by path: "-" sorts before "2"
    assert sub[0].last_commit.title == "add universal build"
    with pytest.raises(EntryNotFoundError):
        list(api.list_repo_tree(REPO_ID, path_in_repo="nope", repo_type="kernel", revision="v1"))


def test_commits_history_paginated(hub, api):
    hub.reset_log()
    commits = api.list_repo_commits(REPO_ID, revision="v1", repo_type="kernel")
    assert [c.title for c in commits] == [
        "docs 3",
        "docs 2",
        "docs 1",
        "docs 0",
        "add weights",
        "add cuda variant",
        "add universal build",
        "initial commit",
    ]
    assert commits[0].message == "body 3" and commits[0].authors == ["fixture-bot"]
    assert commits[0].created_at > commits[-1].created_at
    assert any("/commits/v1" in p and "cursor=" in p for _, p, _ in hub.requests)
    slash = api.list_repo_commits(REPO_ID, revision="release/v1", repo_type="kernel")
    assert [c.title for c in slash][0] == "add cuda variant"


def test_paths_info(api):
    infos = api.get_paths_info(
        REPO_ID, ["README.md", "build", "nope", "weights.bin"], repo_type="kernel", revision="v1"
    )
    assert sorted(i.path for i in infos) == ["README.md", "build", "weights.bin"]


# -- downloads --------------------------------------------------------------------------------------


def test_hf_hub_download_small_and_large(hub, tmp_path):
    kw = dict(repo_type="kernel", revision="v1", cache_dir=tmp_path, endpoint=hub.url, token=False)
    small = hf_hub_download(REPO_ID, f"{UNIV}/__init__.py", **kw)
    assert Path(small).read_bytes() == universal_files(1)[f"{UNIV}/__init__.py"]
    big = hf_hub_download(REPO_ID, "weights.bin", **kw)
    assert Path(big).read_bytes() == BIG
    blobs = tmp_path / f"kernels--{ORG}--{NAME}" / "blobs"
    assert Path(big).resolve() == (blobs / sha256(BIG)).resolve()
    assert Path(small).resolve().name == git_blob_oid(Path(small).read_bytes())
    # slash revision: written as nested refs/release/v1
    hf_hub_download(REPO_ID, "README.md", **{**kw, "revision": "release/v1"})
    assert (tmp_path / f"kernels--{ORG}--{NAME}" / "refs" / "release" / "v1").read_text() == build_repo()[1]["cuda"]


def test_resolve_headers(hub):
    sha = hub.repos[("kernel", REPO_ID)].branches["v1"]
    req = urllib.request.Request(f"{hub.url}/kernels/{REPO_ID}/resolve/v1/weights.bin", method="HEAD")
    with urllib.request.urlopen(req) as r:
        h = r.headers
        assert r.status == 200 and h["X-Repo-Commit"] == sha and h["Content-Length"] == str(len(BIG))
        assert h["ETag"] == h["X-Linked-Etag"] == f'"{sha256(BIG)}"' and h["X-Linked-Size"] == str(len(BIG))
    with get(f"{hub.url}/kernels/{REPO_ID}/resolve/v1/README.md") as r:
        assert r.headers["ETag"].strip('"') == git_blob_oid(r.read()) and "X-Linked-Etag" not in r.headers


def test_snapshot_allow_patterns(hub, tmp_path):
    hub.reset_log()
    folder = snapshot_download(
        REPO_ID,
        repo_type="kernel",
        revision="v1",
        allow_patterns=[f"{UNIV}/*"],
        cache_dir=tmp_path,
        endpoint=hub.url,
        token=False,
    )
    files = sorted(str(p.relative_to(folder)) for p in Path(folder).rglob("*") if p.is_file())
    assert files == [f"{UNIV}/__init__.py", f"{UNIV}/metadata.json"]
    resolved = {p for _, p, _ in hub.requests if "/resolve/" in p}
    assert resolved and all(UNIV in p for p in resolved)


def test_range_requests(hub):
    url = f"{hub.url}/kernels/{REPO_ID}/resolve/v1/weights.bin"
    with get(url, {"Range": "bytes=100-199"}) as r:
        assert r.status == 206 and r.read() == BIG[100:200]
        assert r.headers["Content-Range"] == f"bytes 100-199/{len(BIG)}"
    with get(url, {"Range": "bytes=-10"}) as r:
        assert r.status == 206 and r.read() == BIG[-10:]
    with pytest.raises(urllib.error.HTTPError) as e:
        get(url, {"Range": f"bytes={len(BIG)}-"})
    assert e.value.code == 416


# -- errors -----------------------------------------------------------------------------------------


def test_error_mapping(hub, api, tmp_path):
    with pytest.raises(RepositoryNotFoundError):
        api.repo_info(f"{ORG}/missing", repo_type="kernel")
    with pytest.raises(RevisionNotFoundError):
        api.repo_info(REPO_ID, repo_type="kernel", revision="v9")
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(
            REPO_ID, "nope.txt", repo_type="kernel", revision="v1", cache_dir=tmp_path, endpoint=hub.url, token=False
        )
    assert api.repo_exists(REPO_ID, repo_type="kernel")
    assert not api.repo_exists(f"{ORG}/missing", repo_type="kernel")
    assert not api.repo_exists(REPO_ID)  # same id, but not a model repo
    assert api.file_exists(REPO_ID, "README.md", repo_type="kernel", revision="v1")
    assert not api.file_exists(REPO_ID, "nope.txt", repo_type="kernel", revision="v1")
    assert not api.revision_exists(REPO_ID, "v9", repo_type="kernel")
    with pytest.raises(urllib.error.HTTPError) as e:
        get(f"{hub.url}/api/agent-harnesses")
    assert e.value.code == 404
    with pytest.raises(urllib.error.HTTPError) as e:
        get(f"{hub.url}/kernels/{REPO_ID}/resolve/v1/nope.txt")
    assert e.value.headers["X-Error-Code"] == "EntryNotFound" and e.value.headers["X-Repo-Commit"]
    with get(f"{hub.url}/api/organizations/{ORG}/overview") as r:
        assert json.load(r)["trustedKernelPublisher"] is True
    with get(f"{hub.url}/api/organizations/stranger/overview") as r:
        assert json.load(r)["trustedKernelPublisher"] is False


# -- fault injection --------------------------------------------------------------------------------


def test_fail_next(hub):
    url = f"{hub.url}/api/kernels/{REPO_ID}/refs"
    hub.faults.fail_next(2, 503, match="/refs")
    codes = []
    for _ in range(3):
        try:
            with get(url) as r:
                codes.append(r.status)
        except urllib.error.HTTPError as e:
            codes.append(e.code)
            assert "X-Error-Code" not in e.headers
    assert codes == [503, 503, 200]
    assert [s for _, p, s in hub.requests if p.endswith("/refs")] == [503, 503, 200]


def test_delay(hub):
    import time

    hub.faults.delay("/refs", 0.3)
    t = time.monotonic()
    with get(f"{hub.url}/api/kernels/{REPO_ID}/refs"):
        pass
    assert time.monotonic() - t >= 0.3
    hub.faults.clear()
    t = time.monotonic()
    with get(f"{hub.url}/api/kernels/{REPO_ID}/refs"):
        pass
    assert time.monotonic() - t < 0.3


def test_drop_after(hub, tmp_path):
    url = f"{hub.url}/kernels/{REPO_ID}/resolve/v1/weights.bin"
    hub.faults.drop_after("weights.bin", 1000)
    with pytest.raises((http.client.IncompleteRead, ConnectionError)):
        with get(url) as r:
            r.read()
    with get(url) as r:  # only once
        assert r.read() == BIG
    # The real client survives a drop: it retries with a Range request and gets the right bytes.
    hub.faults.drop_after("weights.bin", 5000)
    hub.reset_log()
    path = hf_hub_download(
        REPO_ID, "weights.bin", repo_type="kernel", revision="v1", cache_dir=tmp_path, endpoint=hub.url, token=False
    )
    assert Path(path).read_bytes() == BIG
    assert [m for m, p, _ in hub.requests if "weights.bin" in p].count("GET") == 2


def test_stop_severs_open_connections_as_a_dead_host_does(hub):
    """A stopped fake Hub must not finish a body in flight, nor answer on a kept-alive connection."""
    host, port = hub.url.removeprefix("http://").split(":")
    idle = http.client.HTTPConnection(host, int(port), timeout=10)
    idle.request("GET", f"/api/kernels/{REPO_ID}/refs")
    idle.getresponse().read()  # a keep-alive connection, now idle
    stop_mid_body(hub, f"{hub.url}/kernels/{REPO_ID}/resolve/v1/weights.bin")
    with pytest.raises((http.client.HTTPException, ConnectionError)):
        idle.request("GET", f"/api/kernels/{REPO_ID}/refs")
        idle.getresponse().read()


def test_tampered_bytes_keep_advertised_metadata(hub, api):
    repo = hub.repos[("kernel", REPO_ID)]
    sha = repo.branches["v1"]
    repo.set_file_bytes(sha, "README.md", b"evil")
    (entry,) = api.get_paths_info(REPO_ID, ["README.md"], repo_type="kernel", revision="v1")
    with get(f"{hub.url}/kernels/{REPO_ID}/resolve/{sha}/README.md") as r:
        served = r.read()
        assert served == b"evil" and r.headers["ETag"].strip('"') == entry.blob_id != git_blob_oid(served)


# -- kernels, in a subprocess -----------------------------------------------------------------------


def test_kernels_get_kernel(hub, tmp_path):
    proc = run_get_kernel(hub, tmp_path / "hf")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "RESULT 1 5" in proc.stdout
    paths = [p for _, p, _ in hub.requests]
    assert f"/api/organizations/{ORG}/overview" in paths and f"/api/kernels/{REPO_ID}/refs" in paths
    assert not any(CUDA in p for p in paths if "/resolve/" in p)


def test_kernels_refuses_untrusted_org(hub, tmp_path):
    hub.trusted_orgs.clear()
    proc = run_get_kernel(hub, tmp_path / "hf")
    assert proc.returncode != 0 and "not from a trusted publisher" in proc.stderr
    assert not any("/resolve/" in p for _, p, _ in hub.requests)
