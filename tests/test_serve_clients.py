"""Real clients through `frt-mirror serve`: the `hf` and `kernels` command-line tools and the
huggingface_hub calls users reach for, each in a subprocess with HF_ENDPOINT at the mirror and the
upstream gone (a tripwire on its port). Also in the huggingface_hub 1.33 venv (marked hub1).

Full ref names (`refs/heads/v1`, `refs/tags/v1.0.0`) are revisions the Hub takes on every route:
`kernels versions` sends the `ref` that `/refs` lists, so a mirror must resolve them too, raw or
percent-encoded; `refs/pr/N` is never staged, a clean RevisionNotFound.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.kernel_fixtures import ACTIVATION, LAYERNORM, X86_CPU
from tests.support.serve_helpers import client_env, raw_http, raw_request, run_client
from tests.support.serve_home import BIG, BIG_FILE, SO

pytestmark = pytest.mark.hub1

V1_FILES = sorted(f"build/{X86_CPU}/{n}" for n in ("__init__.py", "_activation.abi3.so", "metadata.json"))
META = f"build/{X86_CPU}/metadata.json"
# Every spelling of a revision naming activation's v1 head that a client or a user may send.
V1_SPELLINGS = [
    "v1",
    "refs%2Fheads%2Fv1",
    "refs/heads/v1",
    "refs%2Ftags%2Fv1.0.0",
    "refs/tags/v1.0.0",
    "release%2Fv1",
    "refs%2Fheads%2Frelease%2Fv1",
    "refs/heads/release%2Fv1",
]
MISSING = [
    "refs%2Fpr%2F1",
    "refs/pr/1",
    "refs/convert/parquet",
    "refs%2Fheads%2Fv9",
    "refs/heads/v9",
    "refs/tags/v1",
    "refs%2Fheads%2Fv1.0.0",
]


@pytest.fixture(scope="module")
def ledger_backend():
    """SQLite only here: test_serve runs the serve answers on PostgreSQL too."""
    yield None


def tool(name: str, *args: str, url: str, hf_home: Path, cwd: Path | None = None, timeout: float = 180):
    """Run a console script of this venv (`hf`, `kernels`) as a cluster job would."""
    exe = str(Path(sys.executable).with_name(name))
    # The `hf` CLI asks PyPI once a day whether it is current: not the mirror's business, and outside
    # an air gap's reach.
    env = client_env(url, hf_home, HF_HUB_DISABLE_UPDATE_CHECK="1")
    return subprocess.run([exe, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)


def files_under(root: Path) -> dict[str, str]:
    """{relative path: sha256} of the files a download left, without huggingface_hub's own metadata."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".cache" not in p.relative_to(root).parts
    }


def upstream(staged, repo: str, rev: str, paths) -> dict[str, str]:
    commit = staged.repos[repo].commits[staged.repos[repo].branches[rev]]
    return {p: hashlib.sha256(commit.files[p]).hexdigest() for p in paths}


def v1(staged) -> str:
    return staged.repos[ACTIVATION].branches["v1"]


# -- raw HTTP: every route that takes a revision ---------------------------------------------------


def routes(rev: str) -> list[tuple[str, str, bytes]]:
    api = f"/api/kernels/{ACTIVATION}"
    return [
        ("GET", f"{api}/revision/{rev}", b""),
        ("GET", f"{api}/tree/{rev}/build", b""),
        ("GET", f"{api}/commits/{rev}", b""),
        ("POST", f"{api}/paths-info/{rev}", b"paths=build"),
        ("HEAD", f"/kernels/{ACTIVATION}/resolve/{rev}/{META}", b""),
        ("GET", f"/kernels/{ACTIVATION}/resolve/{rev}/{META}", b""),
    ]


def ask(port: int, method: str, path: str, body: bytes):
    extra = ["Content-Type: application/x-www-form-urlencoded"] if method == "POST" else []
    return raw_http(port, raw_request(method, path, *extra, body=body))


def test_full_ref_names_on_every_route(serve_staged, serve_mirror):
    sha = v1(serve_staged)
    meta = serve_staged.repos[ACTIVATION].commits[sha].files[META]
    for rev in V1_SPELLINGS:
        for method, path, body in routes(rev):
            status, headers, out = ask(serve_mirror.port, method, path, body)
            assert status == 200, (method, path, status, headers.get("x-error-message"))
            if "/revision/" in path:
                assert json.loads(out)["sha"] == sha
            elif "/tree/" in path:
                assert [e["path"] for e in json.loads(out)] == [f"build/{X86_CPU}"]
            elif "/commits/" in path:
                assert json.loads(out)[0]["id"] == sha
            elif "/paths-info/" in path:
                assert [e["path"] for e in json.loads(out)] == ["build"]
            else:
                assert headers["x-repo-commit"] == sha and out == (b"" if method == "HEAD" else meta)


def test_other_refs_are_revision_not_found(serve_mirror):
    for rev in MISSING:
        for method, path, body in routes(rev):
            status, headers, _ = ask(serve_mirror.port, method, path, body)
            assert (status, headers.get("x-error-code")) == (404, "RevisionNotFound"), (method, path)


def test_repo_info_without_revision_when_main_is_not_staged(serve_staged, serve_mirror):
    """The Hub answers `/api/{t}s/{repo}` for any repo that exists; big's `main` is not staged (upstream
    has none), and a 404 there made `repo_exists` raise. It describes the newest staged commit."""
    big = serve_staged.repos[BIG]
    assert "main" not in big.branches
    status, _, body = raw_http(serve_mirror.port, raw_request("GET", f"/api/kernels/{BIG}"))
    assert status == 200 and json.loads(body)["sha"] == big.branches["v1"]  # "Rebuild", the newest
    status, headers, _ = raw_http(serve_mirror.port, raw_request("GET", f"/api/kernels/{BIG}/revision/main"))
    assert (status, headers.get("x-error-code")) == (404, "RevisionNotFound")  # main itself stays unknown
    status, _, body = raw_http(serve_mirror.port, raw_request("GET", f"/api/kernels/{ACTIVATION}"))
    # staged main: as before
    assert json.loads(body)["sha"] == serve_staged.repos[ACTIVATION].branches["main"]


# -- the hf CLI ------------------------------------------------------------------------------------


def test_hf_download(serve_staged, serve_mirror, tmp_path):
    # --include into a --local-dir, at a slash branch.
    local = tmp_path / "act"
    p = tool(
        "hf",
        "download",
        ACTIVATION,
        "--repo-type",
        "kernel",
        "--revision",
        "release/v1",
        "--include",
        f"build/{X86_CPU}/*",
        "--local-dir",
        str(local),
        url=serve_mirror.url,
        hf_home=tmp_path / "hf",
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert files_under(local) == upstream(serve_staged, ACTIVATION, "v1", V1_FILES)
    # A whole repo at a slash branch, its 24 MiB LFS file included.
    local = tmp_path / "big"
    p = tool(
        "hf",
        "download",
        BIG,
        "--repo-type",
        "kernel",
        "--revision",
        "release/v1",
        "--local-dir",
        str(local),
        url=serve_mirror.url,
        hf_home=tmp_path / "hf",
    )
    assert p.returncode == 0, p.stderr[-3000:]
    rel = serve_staged.repos[BIG].commits[serve_staged.repos[BIG].branches["release/v1"]]
    assert files_under(local) == upstream(serve_staged, BIG, "release/v1", sorted(rel.files))
    assert BIG_FILE in files_under(local)
    # One file into the cache, by full ref name.
    p = tool(
        "hf",
        "download",
        ACTIVATION,
        META,
        "--repo-type",
        "kernel",
        "--revision",
        "refs/heads/v1",
        url=serve_mirror.url,
        hf_home=tmp_path / "hf2",
    )
    assert p.returncode == 0, p.stderr[-3000:]
    snapshots = tmp_path / "hf2" / "hub" / "kernels--kernels-test--activation" / "snapshots"
    cached = snapshots / v1(serve_staged) / META
    assert cached.read_bytes() == serve_staged.repos[ACTIVATION].commits[v1(serve_staged)].files[META]


# -- the kernels CLI -------------------------------------------------------------------------------


def test_kernels_versions(serve_staged, serve_mirror, tmp_path):
    """`kernels versions` lists `build/` at each version's `ref`: `tree/refs%2Fheads%2Fv1/build`."""
    p = tool("kernels", "versions", ACTIVATION, url=serve_mirror.url, hf_home=tmp_path / "hf")
    assert p.returncode == 0, p.stderr[-3000:]
    blocks = p.stdout.split("Version ")[1:]
    assert [b.split(":")[0] for b in blocks] == ["1", "2"]  # the staged versions
    for block in blocks:
        assert f"{X86_CPU} compatible" in block  # the one variant staged for this host's target


def test_kernels_lock_then_download(serve_staged, serve_mirror, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        '[project]\nname = "uses-kernels"\nversion = "0.1"\n\n'
        f'[tool.kernels.dependencies]\n"{LAYERNORM}" = 1\n"{ACTIVATION}" = 1\n'
    )
    p = tool("kernels", "lock", str(project), url=serve_mirror.url, hf_home=tmp_path / "hf")
    assert p.returncode == 0, p.stderr[-3000:]
    act = serve_staged.repos[ACTIVATION]
    locks = {
        (e["dependency"]["repo-id"], e["dependency"]["version"]): e["lock"]["commit"]
        for e in json.loads((project / "kernels.lock").read_text())
    }
    assert locks == {
        (LAYERNORM, 1): serve_staged.repos[LAYERNORM].branches["v1"],
        (ACTIVATION, 1): act.branches["v1"],
        (ACTIVATION, 2): act.branches["v2"],
    }  # v2: layernorm's kernel-depends
    hf_home = tmp_path / "hf-download"
    p = tool("kernels", "download", str(project), url=serve_mirror.url, hf_home=hf_home)
    assert p.returncode == 0, p.stderr[-3000:]
    hub = hf_home / "hub"
    for (repo, _), sha in locks.items():
        snap = hub / f"kernels--{repo.replace('/', '--')}" / "snapshots" / sha / "build" / X86_CPU
        assert (snap / "__init__.py").is_file() and (snap / "metadata.json").is_file(), (repo, sha)


# -- huggingface_hub's API -------------------------------------------------------------------------


def test_hub_api_with_full_refs_and_patterns(serve_staged, serve_mirror, tmp_path):
    p, out = run_client(
        f"""
        import os
        from huggingface_hub import HfApi, snapshot_download, hf_hub_download
        api = HfApi()
        K = dict(repo_type="kernel")
        def err(fn):
            try:
                return ["ok", fn()]
            except Exception as e:
                return [type(e).__name__, [c.__name__ for c in type(e).__mro__]]
        def listing(snap):
            return sorted(os.path.relpath(os.path.join(d, f), snap) for d, _, fs in os.walk(snap) for f in fs)
        snap = snapshot_download({ACTIVATION!r}, revision="refs/heads/v1", allow_patterns=["*.json"], **K)
        big = snapshot_download({BIG!r}, revision="release/v1", allow_patterns="build/*/*.py", **K)
        report({{
            "files": {{rev: api.list_repo_files({ACTIVATION!r}, revision=rev, **K)
                      for rev in ["v1", "refs/heads/v1", "refs/tags/v1.0.0", "refs/heads/release/v1"]}},
            "info": [api.repo_info({ACTIVATION!r}, revision="refs/heads/v1", **K).sha,
                     api.repo_info({ACTIVATION!r}, revision="refs/tags/v1.0.0", **K).sha],
            "snap": [os.path.basename(snap), listing(snap)], "big": [os.path.basename(big), listing(big)],
            "exists": [api.file_exists({ACTIVATION!r}, {SO!r}, revision="refs/heads/v1", **K),
                       api.file_exists({ACTIVATION!r}, {SO!r}, revision="v1", **K),
                       api.file_exists({ACTIVATION!r}, "README.md", revision="v1", **K),
                       api.revision_exists({ACTIVATION!r}, "refs/heads/v1", **K),
                       api.revision_exists({ACTIVATION!r}, "refs/pr/1", **K)],
            "pr": [err(lambda: api.repo_info({ACTIVATION!r}, revision="refs/pr/1", **K)),
                   err(lambda: api.list_repo_files({ACTIVATION!r}, revision="refs/pr/1", **K)),
                   err(lambda: hf_hub_download({ACTIVATION!r}, {META!r}, revision="refs/pr/1", **K))],
            # big has no main: the repo-level calls must still find the repo.
            "big_repo": [api.repo_exists({BIG!r}, **K), api.repo_info({BIG!r}, **K).sha,
                         api.kernel_info({BIG!r}).sha,
                         api.file_exists({BIG!r}, {BIG_FILE!r}, revision="v1", **K),
                         api.file_exists({BIG!r}, {BIG_FILE!r}, **K)],  # main: not staged, so False
        }})
    """,
        serve_mirror.url,
        tmp_path / "hf",
    )
    assert out is not None, p.stderr[-3000:]
    sha, big = v1(serve_staged), serve_staged.repos[BIG]
    assert out["files"] == {rev: V1_FILES for rev in out["files"]}
    assert out["info"] == [sha, sha]
    assert out["snap"] == [sha, [META]]
    assert out["big"] == [big.branches["release/v1"], ["build/torch-universal/__init__.py"]]
    assert out["exists"] == [True, True, False, True, False]
    for name, chain in out["pr"]:
        assert "RevisionNotFoundError" in chain, (name, chain)
    assert out["big_repo"] == [True, big.branches["v1"], big.branches["v1"], True, False]


def test_hf_file_system(serve_staged, serve_mirror, tmp_path):
    """HfFileSystem addresses kernel repos as `hf://kernels/ORG/NAME[@REV]/PATH` in 1.33 and 2.x alike."""
    p, out = run_client(
        f"""
        import hashlib
        from huggingface_hub import HfFileSystem
        fs = HfFileSystem()
        root = "hf://kernels/{ACTIVATION}"
        def err(fn):
            try:
                return ["ok", fn()]
            except Exception as e:
                return [type(e).__name__, str(e)[:300]]
        report({{
            "ls": {{rev: fs.ls(f"{{root}}@{{rev}}/build", detail=False)
                   for rev in ["v1", "refs%2Fheads%2Fv1", "release%2Fv1", "refs%2Ftags%2Fv1.0.0"]}},
            "glob": fs.glob(f"{{root}}@v1/build/*/metadata.json"),
            "deep": fs.glob(f"{{root}}@v1/**/*.so"),
            "cat": hashlib.sha256(fs.cat(f"{{root}}@v1/{META}")).hexdigest(),
            "cat_lfs": hashlib.sha256(fs.cat(f"{{root}}@refs%2Fheads%2Fv1/{SO}")).hexdigest(),
            "head": fs.open(f"{{root}}@v1/{SO}").read(16).hex(),
            "info": [fs.info(f"{{root}}@v1/{SO}")["size"], fs.exists(f"{{root}}@v1/build/nope"),
                     fs.exists(f"{{root}}@refs%2Fpr%2F1/build")],
            "big_main": err(lambda: fs.ls("hf://kernels/{BIG}")),
            "big_v1": fs.ls("hf://kernels/{BIG}@v1/build", detail=False),
        }})
    """,
        serve_mirror.url,
        tmp_path / "hf",
    )
    assert out is not None, p.stderr[-3000:]
    act = serve_staged.repos[ACTIVATION].commits[v1(serve_staged)]
    prefix = f"kernels/{ACTIVATION}@"
    assert out["ls"] == {rev: [f"{prefix}{rev}/build/{X86_CPU}"] for rev in out["ls"]}
    assert out["glob"] == [f"{prefix}v1/{META}"] and out["deep"] == [f"{prefix}v1/{SO}"]
    assert out["cat"] == hashlib.sha256(act.files[META]).hexdigest()
    assert out["cat_lfs"] == hashlib.sha256(act.files[SO]).hexdigest() and out["head"] == act.files[SO][:16].hex()
    assert out["info"] == [len(act.files[SO]), False, False]
    # Without @REV a path means `main`, which big's upstream has not (nor the mirror). The mirror says
    # RevisionNotFound; HfFileSystem passes that through as is rather than as FileNotFoundError (the
    # client's choice, in both versions): a kernel repo is best addressed at a version branch.
    assert out["big_main"][0] in ("RevisionNotFoundError", "FileNotFoundError"), out["big_main"]
    assert "main" in out["big_main"][1]
    assert out["big_v1"] == [f"kernels/{BIG}@v1/build/torch-universal"]


def test_nothing_reached_upstream(serve_staged, serve_mirror):
    """Runs last in this module: every client above went to the mirror only."""
    assert serve_staged.tripwire.hits == []


@pytest.fixture(autouse=True)
def _serve_still_up(serve_mirror):
    yield
    assert serve_mirror.proc.poll() is None, serve_mirror.stderr()[-2000:]
