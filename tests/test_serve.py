"""`frt-mirror serve`, judged by real, unmodified clients with the upstream stopped.

One home is staged once from the fake Hub (the upstream), then the upstream is stopped and a
tripwire listens on its port: nothing the mirror does may call it. Every client runs in a
subprocess with `HF_ENDPOINT=<mirror>`, `HF_HUB_DISABLE_XET=1` and a fresh `HF_HOME`, under this
interpreter, so running this file under .venv-hub1 exercises huggingface_hub 1.x.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import shutil
import time
from pathlib import Path

import pytest

from tests.support.cli import run_cli
from tests.support.kernel_fixtures import ACTIVATION, LAYERNORM, ORG, X86_CPU
from tests.support.serve_helpers import CuttingProxy, raw_http, raw_request, run_client, serving
from tests.support.serve_home import BIG, BIG_FILE, BIG_SIZE, SO, MiB10, stage

pytestmark = pytest.mark.hub1


def v1(staged, repo=ACTIVATION) -> str:
    return staged.repos[repo].branches["v1"]


def data(staged, repo: str, sha: str, path: str) -> bytes:
    return staged.repos[repo].commits[sha].files[path]


# -- kernels ---------------------------------------------------------------------------------------


def test_get_kernel_loads_the_staged_commits(serve_staged, serve_mirror, tmp_path):
    p, out = run_client(
        f"""
        import os, kernels
        ln = kernels.get_kernel({LAYERNORM!r}, version=1)   # kernel-depends: activation v2, from the mirror
        a1 = kernels.get_kernel({ACTIVATION!r}, version=1)
        report({{"ln": [ln.VARIANT, ln.REVISION_NOTE, ln.add(2, 3)], "a1": [a1.VARIANT, a1.REVISION_NOTE],
                 "snapshots": sorted(os.listdir(os.path.join(
                     os.environ["HF_HOME"], "hub", "kernels--kernels-test--activation", "snapshots")))}})
    """,
        serve_mirror.url,
        tmp_path / "hf",
    )
    assert out is not None, p.stderr
    assert out["ln"] == [X86_CPU, "initial", 5]
    assert out["a1"] == [X86_CPU, "cu-rebuild"]  # the v1 head, as staged
    act = serve_staged.repos[ACTIVATION]
    assert out["snapshots"] == sorted([act.branches["v1"], act.branches["v2"]])
    assert "trust_remote_code" not in p.stderr


# -- huggingface_hub API ---------------------------------------------------------------------------


def test_snapshot_refs_commits_tree_paths_info(serve_staged, serve_mirror, tmp_path):
    p, out = run_client(
        f"""
        import os
        from huggingface_hub import HfApi, snapshot_download
        api = HfApi()
        snap = snapshot_download({ACTIVATION!r}, repo_type="kernel", revision="v1")
        files = sorted(os.path.relpath(os.path.join(d, f), snap) for d, _, fs in os.walk(snap) for f in fs)
        refs = api.list_repo_refs({ACTIVATION!r}, repo_type="kernel")
        big_refs = api.list_repo_refs({BIG!r}, repo_type="kernel")
        commits = api.list_repo_commits({BIG!r}, repo_type="kernel", revision="v1")
        tree = list(api.list_repo_tree({ACTIVATION!r}, repo_type="kernel", revision="v1", recursive=True))
        top = list(api.list_repo_tree({ACTIVATION!r}, repo_type="kernel", revision="v1"))
        sub = list(api.list_repo_tree({ACTIVATION!r}, "build", repo_type="kernel", revision="v1"))
        info = api.get_paths_info({ACTIVATION!r}, ["build", {SO!r}, "nope", "build/torch-cpu"],
                                  repo_type="kernel", revision="v1")
        rel = api.repo_info({BIG!r}, repo_type="kernel", revision="release/v1")
        head = api.repo_info({ACTIVATION!r}, repo_type="kernel", revision="v1")
        report({{
            "files": files, "snap": os.path.basename(snap),
            "branches": {{b.name: b.target_commit for b in refs.branches}},
            "tags": {{t.name: t.target_commit for t in refs.tags}}, "converts": refs.converts,
            "big_branches": {{b.name: b.target_commit for b in big_refs.branches}},
            "commits": [[c.commit_id, c.title, c.created_at.isoformat(), c.authors] for c in commits],
            "tree": [[type(e).__name__, e.path, e.size if hasattr(e, "size") else None,
                      e.lfs.sha256 if getattr(e, "lfs", None) else None] for e in tree],
            "top": [e.path for e in top], "sub": [e.path for e in sub],
            "info": [[type(e).__name__, e.path, getattr(e, "size", None),
                      e.lfs.sha256 if getattr(e, "lfs", None) else None] for e in info],
            "rel": [rel.id, rel.sha], "head": head.sha,
        }})
    """,
        serve_mirror.url,
        tmp_path / "hf",
    )
    assert out is not None, p.stderr
    act, big = serve_staged.repos[ACTIVATION], serve_staged.repos[BIG]
    head = act.commits[act.branches["v1"]]
    prefix = f"build/{X86_CPU}/"
    staged_files = sorted(f for f in head.files if f.startswith(prefix))
    assert out["files"] == staged_files and out["snap"] == head.sha  # exactly the staged variant
    assert out["branches"] == {
        "v1": act.branches["v1"],
        "v2": act.branches["v2"],
        "release/v1": act.branches["v1"],
        "main": act.branches["v2"],
    }
    assert out["tags"] == {"v1.0.0": act.branches["v1"]} and out["converts"] == []
    assert out["big_branches"] == {"v1": big.branches["v1"], "release/v1": big.branches["release/v1"]}
    # History: the staged commits of the line, newest first, with titles; "Initial build" was not
    # staged, so it is not listed (every listed commit resolves on the mirror).
    assert [c[:2] for c in out["commits"]] == [
        [big.branches["v1"], "Rebuild"],
        [big.branches["release/v1"], "Add weights"],
    ]
    assert out["commits"][0][2].startswith("2026-01-01T00:02:00") and out["commits"][0][3] == [ORG]
    so = head.meta[SO]
    assert sorted(e[1] for e in out["tree"]) == sorted(["build", prefix.rstrip("/"), *staged_files])
    assert ["RepoFile", SO, so.size, so.sha256] in out["tree"]
    assert out["top"] == ["build"] and out["sub"] == [prefix.rstrip("/")]
    assert sorted(map(tuple, out["info"])) == [
        ("RepoFile", SO, so.size, so.sha256),
        ("RepoFolder", "build", None, None),
    ]
    assert out["rel"] == [BIG, big.branches["release/v1"]] and out["head"] == head.sha


def test_lfs_download_range_head_and_no_xet(serve_staged, serve_mirror, tmp_path):
    p, out = run_client(
        f"""
        import hashlib, os
        from huggingface_hub import HfApi, get_session, hf_hub_download, hf_hub_url
        path = hf_hub_download({ACTIVATION!r}, {SO!r}, repo_type="kernel", revision="v1")
        s = get_session()
        url = hf_hub_url({ACTIVATION!r}, {SO!r}, repo_type="kernel", revision="v1")
        h = s.head(url)
        full = s.get(url)
        part = s.get(url, headers={{"Range": "bytes=1000-"}})
        mid = s.get(url, headers={{"Range": "bytes=10-19"}})
        past = s.get(url, headers={{"Range": f"bytes={{len(full.content)}}-"}})
        seen = {{}}
        api = "{serve_mirror.url}/api/kernels/{ACTIVATION}"
        for name, r in [("head", h), ("full", full), ("part", part), ("past", past),
                        ("refs", s.get(api + "/refs")), ("info", s.get(api + "/revision/v1")),
                        ("tree", s.get(api + "/tree/v1?recursive=true&expand=true")),
                        ("paths", s.post(api + "/paths-info/v1", data={{"paths": [{SO!r}], "expand": "true"}})),
                        ("commits", s.get(api + "/commits/v1")),
                        ("small", s.head(hf_hub_url({ACTIVATION!r}, "build/{X86_CPU}/__init__.py",
                                                    repo_type="kernel", revision="v1")))]:
            seen[name] = dict(r.headers)
        report({{
            "blob": os.path.basename(os.path.realpath(path)),
            "sha": hashlib.sha256(open(path, "rb").read()).hexdigest(),
            "head": [h.status_code, dict(h.headers), len(h.content)],
            "full": [full.status_code, hashlib.sha256(full.content).hexdigest(), dict(full.headers)],
            "part": [part.status_code, part.content.hex(), dict(part.headers)],
            "mid": [mid.status_code, mid.content.hex(), mid.headers.get("content-range")],
            "past": [past.status_code, dict(past.headers)],
            "seen": seen, "tree": s.get(api + "/tree/v1?recursive=true&expand=true").json(),
        }})
    """,
        serve_mirror.url,
        tmp_path / "hf",
    )
    assert out is not None, p.stderr
    act = serve_staged.repos[ACTIVATION]
    sha = act.branches["v1"]
    so, body = act.commits[sha].meta[SO], data(serve_staged, ACTIVATION, sha, SO)
    assert out["blob"] == so.sha256 == out["sha"]  # the cache blob is named by the sha256 (the LFS etag)
    status, headers, n = out["head"]
    assert status == 200 and n == 0
    assert headers["x-repo-commit"] == sha
    assert headers["etag"] == f'"{so.sha256}"' and headers["x-linked-etag"] == f'"{so.sha256}"'
    assert headers["x-linked-size"] == str(so.size) == headers["content-length"]
    assert "content-encoding" not in headers
    assert out["full"][:2] == [200, so.sha256] and "content-encoding" not in out["full"][2]
    status, part, headers = out["part"]
    assert status == 206 and bytes.fromhex(part) == body[1000:]
    assert headers["content-range"] == f"bytes 1000-{so.size - 1}/{so.size}"
    assert headers["content-length"] == str(so.size - 1000)
    assert out["mid"] == [206, body[10:20].hex(), f"bytes 10-19/{so.size}"]
    assert out["past"][0] == 416 and out["past"][1]["content-range"] == f"bytes */{so.size}"
    # A small (non-LFS) file: the git blob oid as ETag, no X-Linked-*.
    small = out["seen"]["small"]
    assert small["etag"] == f'"{act.commits[sha].meta[f"build/{X86_CPU}/__init__.py"].oid}"'
    assert "x-linked-etag" not in small and "x-linked-size" not in small
    for name, h in out["seen"].items():
        assert not [k for k in h if k.lower().startswith("x-xet")], name
        assert "xet-auth" not in h.get("link", ""), name
    assert "xetHash" not in json.dumps(out["tree"]) and any("lfs" in e for e in out["tree"])


def test_dropped_download_resumes_with_range(serve_staged, serve_mirror, tmp_path):
    big = serve_staged.repos[BIG]
    sha = big.branches["v1"]
    expected = big.commits[sha].meta[BIG_FILE].sha256
    cut_path = f"/kernels/{BIG}/resolve/v1/{BIG_FILE}"  # hf_hub_download GETs the URL it HEADed
    with CuttingProxy(serve_mirror.port, cut_path, cut_after=16 << 20) as proxy:
        p, out = run_client(
            f"""
            import hashlib
            from huggingface_hub import hf_hub_download
            path = hf_hub_download({BIG!r}, {BIG_FILE!r}, repo_type="kernel", revision="v1")
            h = hashlib.sha256()
            with open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
            report(h.hexdigest())
        """,
            proxy.url,
            tmp_path / "hf",
        )
        gets = [e for e in proxy.exchanges if e.method == "GET" and e.path == cut_path]
    assert out == expected, p.stderr
    assert proxy.cuts == 1 and len(gets) == 2, [(e.method, e.path, e.headers.get("range")) for e in proxy.exchanges]
    first, resumed = gets
    assert "range" not in first.headers and first.status == 200
    assert resumed.headers["range"] == f"bytes={MiB10}-"  # resumes from a multiple of the 10 MiB chunk
    assert resumed.status == 206
    assert resumed.response_headers["content-range"] == f"bytes {MiB10}-{BIG_SIZE - 1}/{BIG_SIZE}"


# -- errors ----------------------------------------------------------------------------------------


def test_errors_map_to_the_clients_exceptions(serve_staged, serve_mirror, tmp_path):
    old = serve_staged.repos[ACTIVATION].history(v1(serve_staged))[-1].sha  # exists upstream, never staged
    unstaged = "build/torch-cpu/__init__.py"  # a variant upstream has at the v1 head; not staged
    assert unstaged in serve_staged.repos[ACTIVATION].commits[v1(serve_staged)].files
    p, out = run_client(
        f"""
        import huggingface_hub as h
        from huggingface_hub import HfApi, hf_hub_download
        api = HfApi()
        def err(fn):
            try:
                fn()
                return "no error"
            except Exception as e:
                return [type(e).__name__, [c.__name__ for c in type(e).__mro__]]
        K = dict(repo_type="kernel")
        report({{
            "repo_dl": err(lambda: hf_hub_download("{ORG}/nope", "x", **K)),
            "repo_info": err(lambda: api.repo_info("{ORG}/nope", **K)),
            "refs": err(lambda: api.list_repo_refs("{ORG}/nope", **K)),
            "rev_dl": err(lambda: hf_hub_download({ACTIVATION!r}, {SO!r}, revision={old!r}, **K)),
            "rev_info": err(lambda: api.repo_info({ACTIVATION!r}, revision={old!r}, **K)),
            "rev_tree": err(lambda: list(api.list_repo_tree({ACTIVATION!r}, revision="v9", **K))),
            "rev_snap": err(lambda: h.snapshot_download({ACTIVATION!r}, revision="v9", **K)),
            "entry_dl": err(lambda: hf_hub_download({ACTIVATION!r}, {unstaged!r}, revision="v1", **K)),
            "entry_tree": err(lambda: list(api.list_repo_tree({ACTIVATION!r}, "build/torch-cpu", revision="v1",
                                                               repo_type="kernel"))),
            "exists": [api.repo_exists({ACTIVATION!r}, **K), api.repo_exists("{ORG}/nope", **K),
                       api.repo_exists({ACTIVATION!r}),  # as a model: only kernels are staged
                       *[api.revision_exists({ACTIVATION!r}, rev, **K)
                         for rev in ["v1", "v2", "release/v1", "v9", {old!r}]],
                       api.file_exists({ACTIVATION!r}, {SO!r}, revision="v1", **K),
                       api.file_exists({ACTIVATION!r}, {unstaged!r}, revision="v1", **K),
                       api.file_exists({ACTIVATION!r}, "README.md", revision="v1", **K)],
        }})
    """,
        serve_mirror.url,
        tmp_path / "hf",
    )
    assert out is not None, p.stderr
    for key in ("repo_dl", "repo_info", "refs"):
        assert "RepositoryNotFoundError" in out[key][1], (key, out[key])
    for key in ("rev_dl", "rev_info", "rev_tree", "rev_snap"):
        assert "RevisionNotFoundError" in out[key][1], (key, out[key])
    for key in ("entry_dl", "entry_tree"):
        assert out[key][0] == "RemoteEntryNotFoundError", (key, out[key])
        assert "EntryNotFoundError" in out[key][1], (key, out[key])
    assert out["exists"] == [True, False, False, True, True, True, False, False, True, False, False]


def test_get_kernel_errors(serve_staged, serve_mirror, tmp_path):
    p, out = run_client(
        f"""
        import kernels
        def err(fn):
            try:
                fn()
                return "no error"
            except Exception as e:
                return [type(e).__name__, str(e).splitlines()[0]]
        report([err(lambda: kernels.get_kernel("{ORG}/nope", version=1)),
                err(lambda: kernels.get_kernel({ACTIVATION!r}, version=3)),
                err(lambda: kernels.get_kernel("{ORG}/relu", version=1))])
    """,
        serve_mirror.url,
        tmp_path / "hf",
    )
    assert out is not None, p.stderr
    missing, no_version, unstaged = out
    assert missing[0] == "RepositoryNotFoundError"
    assert no_version == ["ValueError", "Version 3 not found, available versions: 1, 2"]  # the staged refs
    assert unstaged[0] == "RepositoryNotFoundError"  # relu was never staged here


# -- tokens ----------------------------------------------------------------------------------------


def _status(port: int, token: str | None = None, path: str = f"/api/kernels/{ACTIVATION}/refs"):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
    r = c.getresponse()
    r.read()
    c.close()
    return r.status, r.getheader("X-Error-Code")


def _until(fn, want, timeout=5.0):
    deadline = time.monotonic() + timeout
    while (got := fn()) != want and time.monotonic() < deadline:
        time.sleep(0.2)
    return got


def test_tokens(serve_staged, serve_mirror, tmp_path):
    home = tmp_path / "home"
    shutil.copytree(serve_staged.home, home, symlinks=True)
    p = run_cli("token", "add", "ci", home=home)
    assert p.returncode == 0, p.stderr
    ci = p.stdout.strip()
    assert ci.startswith("frt_") and len(ci) > 20 and "\n" not in ci
    with serving(home) as m:
        status, code = _status(m.port)
        assert status == 401 and code
        assert _status(m.port, "frt_wrong")[0] == 401
        assert _status(m.port, ci) == (200, None)
        # HEAD of a file without the token: 401 with the header, no body.
        st, headers, body = raw_http(m.port, raw_request("HEAD", f"/kernels/{ACTIVATION}/resolve/v1/{SO}"))
        assert st == 401 and headers.get("x-error-code") and body == b""
        # The real clients send HF_TOKEN as a Bearer token.
        code = f"import kernels; report(kernels.get_kernel({ACTIVATION!r}, version=1).REVISION_NOTE)"
        p, out = run_client(code, m.url, tmp_path / "hf-ok", HF_TOKEN=ci)
        assert out == "cu-rebuild", p.stderr
        p, out = run_client(code, m.url, tmp_path / "hf-none")
        assert out is None and p.returncode != 0 and "401" in p.stderr

        p = run_cli("token", "add", "ops", home=home)
        ops = p.stdout.strip()
        assert p.returncode == 0 and ops != ci
        assert _until(lambda: _status(m.port, ops)[0], 200) == 200
        assert run_cli("token", "revoke", "ci", home=home).returncode == 0
        assert _until(lambda: _status(m.port, ci)[0], 401) == 401  # revoked within the 2 s re-read
        assert _status(m.port, ops)[0] == 200 and _status(m.port)[0] == 401
        listed = json.loads(run_cli("token", "list", "--json", home=home).stdout)
        assert [t["name"] for t in listed] == ["ops"] and listed[0]["created_at"]
        assert ops not in json.dumps(listed)
        assert run_cli("token", "revoke", "ops", home=home).returncode == 0
        assert _until(lambda: _status(m.port)[0], 200) == 200  # no tokens left: open again
    # On PostgreSQL the copied home shares the module's ledger (the tokens were its rows too): the module's
    # mirror re-reads within its 2 s poll, later on a loaded box; the next tests ask it at once.
    assert _until(lambda: _status(serve_mirror.port)[0], 200, timeout=30) == 200


def test_a_missing_token_is_named_as_such_not_as_trust(serve_staged, serve_mirror, tmp_path):
    """Issue 30, item 1: kernels asks /api/organizations/{org}/overview first; a 401 there read as "could not
    verify publisher trust status. Set trust_remote_code=True", advice that turns the trust check off. The
    overview is public (as on the Hub), so the first request to fail is the revision's, with the token's
    message; the 401 body and serve's log (once) name HF_TOKEN and `frt-mirror token add`."""
    home = tmp_path / "home"
    shutil.copytree(serve_staged.home, home, symlinks=True)
    assert run_cli("token", "add", "ci", home=home).returncode == 0
    with serving(home) as m:
        st, _, body = raw_http(m.port, raw_request("GET", f"/api/organizations/{ORG}/overview"))
        assert st == 200 and json.loads(body)["name"] == ORG
        st, headers, body = raw_http(m.port, raw_request("GET", f"/api/kernels/{ACTIVATION}/revision/v1"))
        assert st == 401 and "HF_TOKEN" in headers["x-error-message"] and "frt-mirror token add" in body.decode()
        code = f"import kernels; report(kernels.get_kernel({ACTIVATION!r}, version=1).REVISION_NOTE)"
        p, out = run_client(code, m.url, tmp_path / "hf-none")
        assert out is None and p.returncode != 0
        assert "trust_remote_code" not in p.stderr and "HF_TOKEN" in p.stderr, p.stderr
        # serve's own log says it once, beside the access lines' 401s.
        assert sum("HF_TOKEN" in ln for ln in m.err.read_text().splitlines()) == 1
    # The token goes again: on PostgreSQL the copied home shares the module's ledger (see test_tokens).
    assert run_cli("token", "revoke", "ci", home=home).returncode == 0
    assert _until(lambda: _status(serve_mirror.port)[0], 200, timeout=30) == 200


# -- hostile input ---------------------------------------------------------------------------------

HOSTILE = [
    f"/kernels/{ACTIVATION}/resolve/v1/../../../../etc/passwd",
    f"/kernels/{ACTIVATION}/resolve/v1/%2e%2e/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
    f"/kernels/{ACTIVATION}/resolve/v1/%2E%2E%2F%2E%2E%2F%2E%2E%2Fetc%2Fpasswd",
    f"/kernels/{ACTIVATION}/resolve/%2e%2e/%2e%2e/etc/passwd",
    f"/kernels/{ACTIVATION}/resolve/v1/build/%zz",
    f"/kernels/{ACTIVATION}/resolve/v1/build/%ff",
    f"/kernels/{ACTIVATION}/resolve/v1/build/%c0%ae%c0%ae/etc/passwd",
    f"/kernels/{ACTIVATION}/resolve/v1/build/a%00b",
    f"/kernels/{ACTIVATION}/resolve/v1/build//{X86_CPU}/__init__.py",
    f"/kernels/{ACTIVATION}/resolve/v1//etc/passwd",
    "//etc/passwd",
    "/" + "a" * 10_000,
    f"/kernels/{ACTIVATION}/resolve/v1/" + "b/" * 5_000,
    "/api/kernels/../../../etc/passwd",
    f"/api/kernels/{ACTIVATION}/tree/v1/..%2F..%2F..%2Fetc",
    f"/api/kernels/{ACTIVATION}/tree/v1/%2e%2e",
    f"/api/kernels/{ACTIVATION}/revision/..%2F..%2Fetc%2Fpasswd",
    f"/api/kernels/{ACTIVATION}/tree/v1?cursor=abc",
    f"/api/kernels/{ACTIVATION}/tree/v1?cursor=" + "9" * 5000,
    f"/kernels/{ACTIVATION}/resolve/v1/build/x%0d%0aSet-Cookie:%20a=b",  # header injection via the message
    f"/api/kernels/{ACTIVATION}/tree/v1/x%0d%0aSet-Cookie:%20a=b",
    "/api/organizations/%ff/overview",
    "/api/organizations/%00/overview",
    "/api/kernels/%2e%2e/%2e%2e/refs",
    "/kernels/../../etc/passwd",
    "/etc/passwd",
    "/%2fetc%2fpasswd",
]


def test_hostile_paths_are_4xx_and_leak_nothing(serve_mirror):
    passwd = [ln.encode() for ln in Path("/etc/passwd").read_text().splitlines() if len(ln) > 8]
    for path in HOSTILE:
        status, headers, body = raw_http(serve_mirror.port, raw_request("GET", path))
        assert 400 <= status < 500, (path[:80], status, body[:200])
        assert "set-cookie" not in headers
        assert not any(ln in body for ln in passwd), path[:80]
    # http.client sends the path as given, too.
    c = http.client.HTTPConnection("127.0.0.1", serve_mirror.port, timeout=10)
    for path in HOSTILE[:10]:
        c.request("GET", path)
        r = c.getresponse()
        body = r.read()
        assert 400 <= r.status < 500 and not any(ln in body for ln in passwd), path
        if r.will_close:
            c.close()
            c = http.client.HTTPConnection("127.0.0.1", serve_mirror.port, timeout=10)
    c.close()
    # Bodies that are not what paths-info expects: a 400, not a 500.
    for body, ctype in [
        (b'{"paths": 5}', "application/json"),
        (b"[1, 2]", "application/json"),
        (b"null", "application/json"),
        (b"{", "application/json"),
    ]:
        req = raw_request("POST", f"/api/kernels/{ACTIVATION}/paths-info/v1", f"Content-Type: {ctype}", body=body)
        assert raw_http(serve_mirror.port, req)[0] == 400, body
    # Odd methods and headers.
    url = f"/kernels/{ACTIVATION}/resolve/v1/{SO}"
    for req in [
        raw_request("DELETE", url),
        raw_request("POST", f"/api/kernels/{ACTIVATION}/refs"),
        raw_request("GET", url, "Range: bytes=99999999999999999999-"),
        raw_request("GET", url, "Range: bytes=" + "9" * 5000 + "-"),
    ]:
        assert 400 <= raw_http(serve_mirror.port, req)[0] < 500, req[:100]
    assert serve_mirror.proc.poll() is None


def test_head_on_the_wire_has_no_body(serve_staged, serve_mirror):
    so = serve_staged.repos[ACTIVATION].commits[v1(serve_staged)].meta[SO]
    url = f"/kernels/{ACTIVATION}/resolve/v1/{SO}"
    status, headers, body = raw_http(serve_mirror.port, raw_request("HEAD", url, "Accept-Encoding: gzip"))
    assert status == 200 and body == b""
    assert headers["content-length"] == str(so.size) and "content-encoding" not in headers
    assert headers["x-repo-commit"] == v1(serve_staged)
    status, headers, body = raw_http(serve_mirror.port, raw_request("GET", url, "Accept-Encoding: gzip, deflate"))
    assert status == 200 and "content-encoding" not in headers
    assert hashlib.sha256(body).hexdigest() == so.sha256


def test_head_refs_answers_as_get_does(serve_mirror):
    url = f"/api/kernels/{ACTIVATION}/refs"
    get_status, get_headers, get_body = raw_http(serve_mirror.port, raw_request("GET", url))
    status, headers, body = raw_http(serve_mirror.port, raw_request("HEAD", url))
    assert (get_status, status, body) == (200, 200, b"")  # it was a 404 where GET was a 200
    assert headers["content-length"] == get_headers["content-length"] == str(len(get_body))
    assert headers["content-type"] == get_headers["content-type"] == "application/json"


# -- chaining: a site mirror fed by a regional one -------------------------------------------------


def test_a_mirror_stages_from_a_mirror(serve_staged, serve_mirror, tmp_path, monkeypatch):
    monkeypatch.delenv("FRT_LEDGER_URL", raising=False)  # the site's own ledger, whatever the regional's
    site = tmp_path / "site"
    rows = stage(site, serve_staged.manifests, serve_mirror.url)

    def key(r):
        return tuple(r[k] for k in ("repo", "requested", "target", "commit", "variant", "files", "bytes", "status"))

    assert sorted(map(key, rows)) == sorted(map(key, serve_staged.rows))
    assert all(r["status"] == "staged" for r in rows)
    p = run_cli("verify", "--json", home=site)
    assert p.returncode == 0, p.stdout
    # The upstream's word on trust, relayed by the regional mirror, recorded by the site's.
    from frt.mirror.home_path import ledger_path
    from frt.resolver.ledger import Ledger

    assert Ledger(ledger_path(site)).publishers()[ORG].trusted is True


# -- env --serve ----------------------------------------------------------------------------------


def test_env_serve(tmp_path):
    home = tmp_path / "home"
    p = run_cli("env", "--serve", "http://mirror.example:8470/", home=home)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert "export HF_ENDPOINT=http://mirror.example:8470" in lines
    assert "export HF_HUB_DISABLE_XET=1" in lines
    assert any(ln.startswith("#") and "HF_HUB_DISABLE_TELEMETRY" in ln for ln in lines)
    assert not any(ln.startswith("export HF_HUB_DISABLE_TELEMETRY") for ln in lines)
    doc = json.loads(run_cli("env", "--serve", "http://10.0.0.5:8470", "--format", "json", home=home).stdout)
    assert doc["env"] == {"HF_ENDPOINT": "http://10.0.0.5:8470", "HF_HUB_DISABLE_XET": "1"}
    assert any("HF_HUB_DISABLE_TELEMETRY" in w for w in doc["warnings"])
    assert run_cli("env", "--serve", "mirror:8470", home=home).returncode == 2
    assert run_cli("env", home=home).returncode == 2


def test_nothing_reached_upstream(serve_staged, serve_mirror):
    """Runs last in this module: every test above went to the mirror only, never to the upstream."""
    assert serve_staged.tripwire.hits == []
