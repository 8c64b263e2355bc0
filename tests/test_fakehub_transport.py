"""The fake Hub's real-Hub transport switches, judged by the real clients (huggingface_hub 2.x and 1.x,
kernels in a subprocess): 307 to the resolve-cache for small files, 302 to an expiring signed CDN URL on
a second host for LFS files, fixed-window rate limits with 429s, and a stale `/revision/main` after a
force-push. Each test asserts what the client was seen to do, version by version where they differ.
"""

from __future__ import annotations

import http.client
import json
import time
from pathlib import Path
from urllib.parse import urlsplit

import huggingface_hub
import pytest
from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_download, hf_hub_url, snapshot_download
from huggingface_hub.errors import HfHubHTTPError, RevisionNotFoundError

from tests.support import tinyadd
from tests.support.fakehub import FakeHub, RateLimits, sha256

pytestmark = pytest.mark.hub1

ORG, REPO_ID, UNIV, BIG = tinyadd.ORG, tinyadd.REPO_ID, tinyadd.UNIV, tinyadd.BIG
HUB2 = int(huggingface_hub.__version__.split(".")[0]) >= 2
BLOB = f"{UNIV}/_blob.bin"  # an LFS file inside the variant get_kernel downloads: it comes off the CDN


def build_repo():
    repo, shas = tinyadd.build_repo()
    repo.commit({BLOB: BIG[::-1]}, title="add an LFS file to the universal build", branch="v1")
    return repo, shas


@pytest.fixture
def hub():
    repo, _ = build_repo()
    with FakeHub([repo], trusted_orgs=[ORG], page_size=tinyadd.PAGE, redirects=True) as h:
        yield h


@pytest.fixture
def api(hub):
    return HfApi(endpoint=hub.url, token=False)


def v1(hub):
    repo = hub.repos[("kernel", REPO_ID)]
    return repo.commits[repo.branches["v1"]]


def raw(url: str, method: str = "GET", headers: dict | None = None) -> http.client.HTTPResponse:
    """One request on a fresh connection, no redirect following; the body is read into `.body`."""
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    conn.request(method, u.path + (f"?{u.query}" if u.query else ""), headers=headers or {})
    r = conn.getresponse()
    r.body = r.read()
    conn.close()
    return r


def transfers(hub) -> list:
    """The request log without the client's once-per-process agent-harness probe."""
    return [e for e in hub.request_log if e.path != "/api/agent-harnesses"]


def dl(hub, path: str, cache: Path, **kw) -> Path:
    kw = {"repo_type": "kernel", "revision": "v1", "cache_dir": cache, "endpoint": hub.url, "token": False, **kw}
    return Path(hf_hub_download(REPO_ID, path, **kw))


# -- the wire, raw ---------------------------------------------------------------------------------


def test_small_file_307_to_same_host_resolve_cache(hub):
    c = v1(hub)
    r = raw(f"{hub.url}/kernels/{REPO_ID}/resolve/v1/README.md", "HEAD")
    oid = c.meta["README.md"].oid
    assert r.status == 307 and r.headers["X-Repo-Commit"] == c.sha and r.headers["ETag"] == f'"{oid}"'
    loc = r.headers["Location"]
    assert loc.startswith(f"/api/resolve-cache/kernels/{REPO_ID}/{c.sha}/README.md?") and "etag=%22" in loc
    got = raw(hub.url + loc)
    assert got.status == 200 and got.body == c.files["README.md"]
    assert got.headers["ETag"] == f'"{oid}"' and got.headers["X-Repo-Commit"] == c.sha
    assert got.headers["Content-Length"] == str(len(got.body)) and got.headers["Accept-Ranges"] == "bytes"
    part = raw(hub.url + loc, headers={"Range": "bytes=2-5"})
    assert part.status == 206 and part.body == c.files["README.md"][2:6]
    assert raw(hub.url + loc, "HEAD").headers["Content-Length"] == str(len(c.files["README.md"]))
    # a sha the repo does not have (as after a force-push): RevisionNotFound, not a body
    gone = raw(hub.url + loc.replace(c.sha, "0" * 40))
    assert gone.status == 404 and gone.headers["X-Error-Code"] == "RevisionNotFound"


def test_lfs_302_to_signed_url_on_a_second_host(hub):
    c = v1(hub)
    r = raw(f"{hub.url}/kernels/{REPO_ID}/resolve/v1/weights.bin", "HEAD")
    assert r.status == 302 and r.headers["X-Repo-Commit"] == c.sha
    assert r.headers["ETag"] == r.headers["X-Linked-Etag"] == f'"{sha256(BIG)}"'
    assert r.headers["X-Linked-Size"] == str(len(BIG))
    loc = urlsplit(r.headers["Location"])
    assert loc.hostname == "127.0.0.2" and urlsplit(hub.url).hostname == "127.0.0.1"
    assert loc.path == f"/cdn/{sha256(BIG)}" and "Expires=" in loc.query and "Signature=" in loc.query
    got = raw(f"{hub.url}/kernels/{REPO_ID}/resolve/v1/weights.bin")  # a GET: the same 302, with a body
    assert got.status == 302 and got.body and got.headers["Content-Length"] == str(len(got.body))
    body = raw(r.headers["Location"])
    assert body.status == 200 and body.body == BIG and body.headers["ETag"] == f'"{sha256(BIG)}"'
    assert "X-Repo-Commit" not in body.headers  # the CDN knows nothing of commits
    assert "weights.bin" in body.headers["Content-Disposition"]
    part = raw(r.headers["Location"], headers={"Range": "bytes=1000-"})
    assert part.status == 206 and part.body == BIG[1000:]
    assert part.headers["Content-Range"] == f"bytes 1000-{len(BIG) - 1}/{len(BIG)}"
    forged = raw(r.headers["Location"].replace("Signature=", "Signature=0"))
    assert forged.status == 403 and b"AccessDenied" in forged.body and "X-Error-Code" not in forged.headers
    cdn = [e for e in hub.request_log if e.server == "cdn"]
    assert [(e.method, e.status) for e in cdn] == [("GET", 200), ("GET", 206), ("GET", 403)]


def test_stop_stops_the_cdn_too(hub):
    loc = raw(f"{hub.url}/kernels/{REPO_ID}/resolve/v1/weights.bin", "HEAD").headers["Location"]
    tinyadd.stop_mid_body(hub, loc)
    with pytest.raises(OSError):
        raw(loc)


# -- huggingface_hub -------------------------------------------------------------------------------


def test_hf_hub_download_small_and_large(hub, tmp_path):
    c = v1(hub)
    hub.reset_log()
    # A token, to see where the client sends it: to the Hub host on both hops, never to the CDN.
    small = dl(hub, f"{UNIV}/__init__.py", tmp_path, token="hf_fake")
    big = dl(hub, "weights.bin", tmp_path, token="hf_fake")
    assert small.read_bytes() == c.files[f"{UNIV}/__init__.py"] and big.read_bytes() == BIG
    assert small.resolve().name == c.meta[f"{UNIV}/__init__.py"].oid and big.resolve().name == sha256(BIG)
    seen = [(e.server, e.method, e.status) for e in transfers(hub)]
    # Same for 2.x and 1.33: the client follows the relative 307 itself (HEAD), then GETs the final
    # resolve-cache URL; for LFS it stops at the cross-host 302 and GETs the CDN URL directly.
    assert seen == [
        ("hub", "HEAD", 307),
        ("hub", "HEAD", 200),
        ("hub", "GET", 200),
        ("hub", "HEAD", 302),
        ("cdn", "GET", 200),
    ]
    auth = [any(k.lower() == "authorization" for k in e.headers) for e in transfers(hub)]
    assert auth == [True, True, True, True, False]


def test_get_hf_file_metadata_reads_the_redirect(hub):
    c = v1(hub)
    lfs = get_hf_file_metadata(
        hf_hub_url(REPO_ID, "weights.bin", repo_type="kernel", revision="v1", endpoint=hub.url), token=False
    )
    assert (lfs.commit_hash, lfs.etag, lfs.size) == (c.sha, sha256(BIG), len(BIG))
    assert lfs.location.startswith(hub.cdn_url + "/cdn/")  # it stopped at the CDN redirect
    small = get_hf_file_metadata(
        hf_hub_url(REPO_ID, "README.md", repo_type="kernel", revision="v1", endpoint=hub.url), token=False
    )
    assert (small.commit_hash, small.etag, small.size) == (c.sha, c.meta["README.md"].oid, len(c.files["README.md"]))
    assert small.location.startswith(f"{hub.url}/api/resolve-cache/")  # it followed the same-host 307
    assert not any(e.server == "cdn" for e in hub.request_log)  # metadata never touches the CDN


def test_snapshot_download(hub, tmp_path):
    c = v1(hub)
    folder = Path(
        snapshot_download(REPO_ID, repo_type="kernel", revision="v1", cache_dir=tmp_path, endpoint=hub.url, token=False)
    )
    got = {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    assert got == c.files
    cdn_gets = [p.split("?")[0] for m, p, s in hub.requests if p.startswith("/cdn/") and m == "GET"]
    assert sorted(cdn_gets) == sorted(f"/cdn/{sha256(d)}" for d in (BIG, BIG[::-1]))


def test_paths_info_and_tree(hub, api):
    c = v1(hub)
    infos = {
        i.path: i
        for i in api.get_paths_info(REPO_ID, ["README.md", "weights.bin", "build"], repo_type="kernel", revision="v1")
    }
    assert infos["README.md"].blob_id == c.meta["README.md"].oid and infos["README.md"].lfs is None
    assert infos["weights.bin"].lfs.sha256 == sha256(BIG) and infos["weights.bin"].size == len(BIG)
    tree = {e.path: e for e in api.list_repo_tree(REPO_ID, repo_type="kernel", revision="v1", recursive=True)}
    assert set(tree) == set(c.files) | c.dirs() and tree[BLOB].lfs.sha256 == sha256(BIG[::-1])


def cut_download(hub, tmp_path, *, ignore_range: bool = False) -> tuple[list, list]:
    """A 24 MiB file (past the clients' 10 MiB read chunk) on branch `huge`, downloaded with its CDN body
    cut after 16 MiB (and, with `ignore_range`, a CDN that answers a Range with the whole file): it arrives
    whole. The CDN's (method, status) of each request, and the Range header each one sent."""
    huge = bytes(range(256)) * (96 * 1024)
    hub.repos[("kernel", REPO_ID)].commit({"huge.bin": huge}, title="add a huge file", branch="huge")
    hub.faults.drop_after("huge.bin", 16 << 20)  # the name rides in the CDN URL's query
    if ignore_range:
        hub.faults.ignore_range("huge.bin")
    path = dl(hub, "huge.bin", tmp_path, revision="huge")
    assert path.read_bytes() == huge
    cdn = [e for e in hub.request_log if e.server == "cdn"]
    ranges = [{k.lower(): v for k, v in e.headers.items()}.get("range") for e in cdn]
    return [(e.method, e.status) for e in cdn], ranges


def test_resumed_download_after_a_cdn_body_is_cut(hub, tmp_path):
    statuses, ranges = cut_download(hub, tmp_path)
    # Both versions resume at the CDN (same signed URL) from a multiple of their 10 MiB chunk.
    assert statuses == [("GET", 200), ("GET", 206)]
    assert ranges == [None, f"bytes={10 << 20}-"]
    assert [s for m, p, s in hub.requests if "/resolve/" in p] == [302]  # the Hub was asked once


def test_a_cdn_that_ignores_range_is_taken_as_start_over(hub, tmp_path):
    """fake Hub `ignore_range`: the resume gets a 200 with the whole file, and both clients start over
    (huggingface_hub truncates what it had: a CDN that will not range a compressed answer)."""
    statuses, ranges = cut_download(hub, tmp_path, ignore_range=True)
    assert statuses == [("GET", 200), ("GET", 200)]
    assert ranges == [None, f"bytes={10 << 20}-"]


def test_expired_signed_url(hub, tmp_path):
    hub.cdn_url_ttl = 1
    url = hf_hub_url(REPO_ID, "weights.bin", repo_type="kernel", revision="v1", endpoint=hub.url)
    old = get_hf_file_metadata(url, token=False).location
    assert raw(old).status == 200
    time.sleep(2.1)  # Expires is rounded up to the next second
    expired = raw(old)
    assert expired.status == 403 and b"expired" in expired.body and "X-Error-Code" not in expired.headers
    # A URL that expires between the client's HEAD and its GET: the client does not go back to the
    # Hub for a fresh one; the download fails with the CDN's bare 403.
    hub.faults.delay("/cdn/", 2.1)
    with pytest.raises(HfHubHTTPError) as e:
        dl(hub, "weights.bin", tmp_path)
    assert e.value.response.status_code == 403
    hub.faults.clear()
    # Asked again, the Hub hands out a fresh 302, and the download works.
    hub.reset_log()
    assert dl(hub, "weights.bin", tmp_path).read_bytes() == BIG
    assert [(e.server, e.status) for e in transfers(hub)] == [("hub", 302), ("cdn", 200)]


def test_stale_revision_after_force_push(tmp_path):
    repo, shas = build_repo()
    old_head = repo.commit({"README.md": b"# about to be rewritten\n"}, title="oops", branch="main")
    repo.branch("rewrite", shas["root"])
    new_head = repo.commit({"README.md": b"# rewritten\n"}, title="rewritten", branch="rewrite")
    del repo.branches["rewrite"]
    assert repo.force_push("main", new_head, stale_for=2) == old_head
    assert old_head not in repo.commits
    with FakeHub([repo], trusted_orgs=[ORG], redirects=True) as hub:
        api = HfApi(endpoint=hub.url, token=False)
        refs = api.list_repo_refs(REPO_ID, repo_type="kernel")
        assert {b.name: b.target_commit for b in refs.branches}["main"] == new_head
        assert api.repo_info(REPO_ID, repo_type="kernel").sha == old_head  # stale answer 1 of 2
        # snapshot_download resolves main through /revision/main (stale answer 2) and then asks for
        # the tree of a commit that is gone.
        with pytest.raises(RevisionNotFoundError):
            snapshot_download(REPO_ID, repo_type="kernel", cache_dir=tmp_path, endpoint=hub.url, token=False)
        with pytest.raises(RevisionNotFoundError):
            dl(hub, "README.md", tmp_path, revision=old_head)
        assert api.repo_info(REPO_ID, repo_type="kernel", revision="main").sha == new_head  # caught up
        folder = snapshot_download(REPO_ID, repo_type="kernel", cache_dir=tmp_path, endpoint=hub.url, token=False)
        assert (Path(folder) / "README.md").read_bytes() == b"# rewritten\n"


# -- rate limits -----------------------------------------------------------------------------------


def test_rate_limit_headers_429_and_window_reset():
    repo, _ = build_repo()
    limits = RateLimits(api=3, resolvers=4, window=2)
    with FakeHub([repo], trusted_orgs=[ORG], redirects=True, rate_limits=limits) as hub:
        refs = f"{hub.url}/api/kernels/{REPO_ID}/refs"
        first = [raw(refs) for _ in range(3)]
        assert [r.status for r in first] == [200, 200, 200]
        left = [r.headers["RateLimit"].split(";")[:2] for r in first]
        assert left == [['"api"', f"r={n}"] for n in (2, 1, 0)]
        assert first[0].headers["RateLimit-Policy"] == '"fixed window";"api";q=3;w=2'
        over = raw(refs)
        assert over.status == 429 and "X-Error-Code" not in over.headers
        t = int(over.headers["RateLimit"].rsplit("t=", 1)[1])
        assert over.headers["RateLimit"] == f'"api";r=0;t={t}' and over.headers["Retry-After"] == str(t)
        assert 0 <= t <= 2 and "quota" in json.loads(over.body)["error"]
        assert raw(f"{hub.url}/api/organizations/{ORG}/overview").status == 429  # the whole bucket
        # resolve and resolve-cache are another bucket; the CDN is not counted at all
        small = raw(f"{hub.url}/kernels/{REPO_ID}/resolve/v1/README.md", "HEAD")
        assert small.status == 307 and small.headers["RateLimit"].startswith('"resolvers";r=3;')
        cached = raw(hub.url + small.headers["Location"])
        assert cached.status == 200 and cached.headers["RateLimit"].startswith('"resolvers";r=2;')
        lfs = raw(f"{hub.url}/kernels/{REPO_ID}/resolve/v1/weights.bin", "HEAD")
        assert lfs.status == 302 and lfs.headers["RateLimit"].startswith('"resolvers";r=1;')
        cdn = raw(lfs.headers["Location"])
        assert cdn.status == 200 and "RateLimit" not in cdn.headers
        time.sleep(t + 0.1)
        again = raw(refs)  # a new window opens at the first request after the old one ended
        assert again.status == 200 and again.headers["RateLimit"].startswith('"api";r=2;t=2')


def test_clients_on_429():
    """What each client does with a 429 (RateLimit r=0): refs never retries; the tree listing's first
    page retries after t + 1 s on 2.x and fails on 1.33 (which retries only later pages)."""
    repo, _ = build_repo()
    with FakeHub([repo], trusted_orgs=[ORG], rate_limits=RateLimits(api=2, window=2)) as hub:
        api = HfApi(endpoint=hub.url, token=False)
        for _ in range(2):
            raw(f"{hub.url}/api/kernels/{REPO_ID}/refs")
        with pytest.raises(HfHubHTTPError) as e:
            api.list_repo_refs(REPO_ID, repo_type="kernel")
        assert e.value.response.status_code == 429
        assert [s for m, p, s in hub.requests if p.endswith("/refs")] == [200, 200, 429]  # no retry
        hub.rate_limits = RateLimits(api=2, window=2)  # fresh windows
        for _ in range(2):
            raw(f"{hub.url}/api/kernels/{REPO_ID}/refs")
        hub.reset_log()
        t0 = time.monotonic()

        def tree():
            return list(api.list_repo_tree(REPO_ID, path_in_repo="build", repo_type="kernel", revision="v1"))

        if HUB2:
            assert [e.path for e in tree()] == [UNIV, tinyadd.CUDA]
            assert time.monotonic() - t0 >= 2
            assert [s for m, p, s in hub.requests if "/tree/" in p] == [429, 200]
        else:
            with pytest.raises(HfHubHTTPError) as e:
                tree()
            assert e.value.response.status_code == 429
            assert [s for m, p, s in hub.requests if "/tree/" in p] == [429]


# -- kernels, in a subprocess ----------------------------------------------------------------------


def test_kernels_get_kernel_through_redirects(hub, tmp_path):
    proc = tinyadd.run_get_kernel(hub, tmp_path / "hf")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "RESULT 1 5" in proc.stdout
    log = hub.request_log
    assert any(e.status == 307 for e in log) and any(e.path.startswith("/api/resolve-cache/") for e in log)
    blob = sha256(BIG[::-1])
    assert [(e.method, e.status) for e in log if e.server == "cdn"] == [("GET", 200)]
    assert any(e.path.startswith(f"/cdn/{blob}?") for e in log)
    assert (tmp_path / "hf" / "hub" / f"kernels--{ORG}--{tinyadd.NAME}" / "blobs" / blob).is_file()


def test_kernels_get_kernel_rate_limited(tmp_path):
    """api=3: the agent-harness probe, the trust check and /refs fit; the first /tree page gets the 429.
    (All of get_kernel's requests come within ~30 ms, so they share the first window.)"""
    repo, _ = build_repo()
    limits = RateLimits(api=3, resolvers=100, window=3)
    with FakeHub([repo], trusted_orgs=[ORG], page_size=tinyadd.PAGE, redirects=True, rate_limits=limits) as hub:
        proc = tinyadd.run_get_kernel(hub, tmp_path / "hf")
        api = [
            (p.split("?")[0].rsplit("/", 1)[-1], s)
            for m, p, s in hub.requests
            if p.startswith("/api/") and not p.startswith("/api/resolve-cache/")
        ]
    assert api[:4] == [("agent-harnesses", 404), ("overview", 200), ("refs", 200), ("build", 429)]
    if HUB2:
        # 2.x waits out t + 1 s (every tree page goes through its backoff) and loads the kernel.
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "RESULT 1 5" in proc.stdout and api[4] == ("build", 200)
    else:
        # 1.33 fetches a listing's first page without backoff: get_kernel fails at once.
        assert proc.returncode != 0 and "429" in proc.stderr and len(api) == 4
