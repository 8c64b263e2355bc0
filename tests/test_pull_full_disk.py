"""Pull-through on a full disk keeps serving (issue 49): serve's home on a small tmpfs (tests/support/tmpfs.py),
the fake Hub with files larger than the free space. A file the disk cannot take is passed through from the
upstream, verified (its last chunk held until the digest matches), never kept; refs and listings are
answered from memory when the ledger cannot be written; the client gets a whole, right answer, never a
short 200, a 502 or a 404 for a repo the upstream has. The log says once that the disk is full, with no
traceback, and /metrics has frt_mirror_disk_full. Unmodified clients: huggingface_hub (also in the 1.33
venv: marked hub1) and kernels.get_kernel, in subprocesses."""

from __future__ import annotations

import hashlib
import json
import re
import threading

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.fakehub import FakeHub, FakeRepo
from tests.support.kernel_fixtures import ORG, RELU, blob, demo_repos, variant_files
from tests.support.serve_helpers import raw_http, raw_request, read_held_stream, run_client, serve_env
from tests.support.tmpfs import fill, parts, serving_on_tmpfs

pytestmark = pytest.mark.hub1

HEAVY = f"{ORG}/heavy"
V = "torch-universal"
WEIGHTS = f"build/{V}/_weights.bin"  # 10 MiB: streamed while fetched (serve/pull.py STREAM_MIN), larger than the disk
PIECES = [f"build/{V}/_piece_{i}.bin" for i in range(4)]  # 2 MiB each: verified before their first byte
FULL = re.compile(r"the home's disk is full \(")  # serve's own line (serve/disk.py)


def heavy_repo() -> FakeRepo:
    extra = {"_weights.bin": blob("heavy-weights", 10 << 20)}
    extra.update({f"_piece_{i}.bin": blob(f"heavy-piece-{i}", 2 << 20) for i in range(4)})
    repo = FakeRepo(HEAVY)
    repo.commit(
        {"README.md": b"# heavy\n", **variant_files("heavy", V, version=1, extra=extra)}, title="heavy", branch="v1"
    )
    return repo


@pytest.fixture
def upstream():
    with FakeHub([*demo_repos(), heavy_repo()], trusted_orgs=[ORG], page_size=5, redirects=True) as hub:
        yield hub


def content(hub: FakeHub, repo_id: str, path: str) -> bytes:
    repo = hub.repos[("kernel", repo_id)]
    return repo.commits[repo.branches["v1"]].files[path]


def on_tmpfs(tmp_path, hub: FakeHub, size: str):
    # FRT_DISK_MARGIN_MIB=0: the whole of a tiny disk is free space (the default keeps 64 MiB spare at least)
    env = serve_env(FRT_DISK_MARGIN_MIB="0")
    return serving_on_tmpfs(tmp_path, size, "--upstream", hub.url, "--allow", ORG, "--upstream-timeout", "30", env=env)


def get(port: int, path: str, timeout: float = 60) -> tuple[int, dict[str, str], bytes]:
    return raw_http(port, raw_request("GET", path), timeout=timeout)


def sample(port: int, name: str, **labels: str) -> float | None:
    """A sample of serve's /metrics, by name and labels."""
    _, _, body = get(port, "/metrics")
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            if s.name == name and s.labels == labels:
                return s.value
    return None


def refs_from_memory(port: int) -> float:
    return sample(port, "frt_mirror_pull_seconds_count", kind="refs", outcome="memory") or 0


def log_checked(stderr: str) -> None:
    """serve's log says once that the disk is full, and never shows a traceback. Another part may say once
    what it keeps in memory meanwhile (serve's demand counts do), without saying the disk is full again:
    not in its words, nor in the ledger's own ("database or disk is full")."""
    assert "Traceback" not in stderr, stderr[-4000:]
    said = [ln for ln in stderr.splitlines() if FULL.search(ln)]
    assert len(said) == 1, "\n".join(said) or stderr[-4000:]
    lines = [ln for ln in stderr.splitlines() if '"' not in ln]  # not access-log lines
    disk = [ln for ln in lines if re.search(r"disk is full|No space left", ln)]
    assert disk == said, "\n".join(disk)


def test_the_operators_full_disk_whole_answers_refs_from_memory_and_no_parts_left(upstream, tmp_path):
    """What the operator saw, each answered right: a file bigger than the free space (a whole 200, not one
    cut where the disk filled), then with the disk full: the refs of a repo never asked before (not 404),
    a small file and a 2 MiB one (not 502); no `.part` left; one log line; the gauge at 1."""
    with on_tmpfs(tmp_path, upstream, "6m") as (m, disk):
        url = f"/kernels/{HEAVY}/resolve/v1/{WEIGHTS}"
        status, headers, body = get(m.port, url)
        want = content(upstream, HEAVY, WEIGHTS)
        assert status == 200 and int(headers["content-length"]) == len(want), (status, headers)
        assert len(body) == len(want) and body == want, f"{len(body)} bytes of {len(want)}, right: {body == want}"
        assert parts(disk) == []

        fill(disk)
        status, headers, body = get(m.port, f"/api/kernels/{RELU}/refs")
        assert status == 200, (status, headers)
        assert "v1" in {b["name"] for b in json.loads(body)["branches"]}
        assert refs_from_memory(m.port) >= 1, "the ledger could not record relu's refs: answered from memory"
        for repo_id, path in ((RELU, f"build/{V}/metadata.json"), (HEAVY, PIECES[0]), (HEAVY, WEIGHTS)):
            status, headers, body = get(m.port, f"/kernels/{repo_id}/resolve/v1/{path}")
            assert status == 200 and body == content(upstream, repo_id, path), (path, status, headers, len(body))
        assert parts(disk) == []
        assert sample(m.port, "frt_mirror_disk_full") == 1
        log_checked(m.stderr())


def test_a_disk_that_fills_while_a_big_file_streams_still_gives_the_client_all_of_it(upstream, tmp_path):
    """The file fits when its fetch starts; the client has its first MiBs (streamed from the growing `.part`)
    when a second writer fills the disk. The fetch fails, its part is removed at once, and the client's
    answer goes on from the upstream, passed through from the byte it had reached: whole and right."""
    upstream.faults.hold("_weights.bin", 4 << 20)
    with on_tmpfs(tmp_path, upstream, "32m") as (m, disk):

        def filled_then_released() -> None:
            fill(disk)
            upstream.faults.release()

        _, body, before = read_held_stream(
            m.port, f"/kernels/{HEAVY}/resolve/v1/{WEIGHTS}", 4 << 20, filled_then_released
        )
        assert before > 0
        assert body == content(upstream, HEAVY, WEIGHTS), f"{len(body)} bytes, {before} before the disk filled"
        assert parts(disk) == []
        assert sample(m.port, "frt_mirror_disk_full") == 1
        log_checked(m.stderr())


CLIENTS = """
    import hashlib, threading
    from huggingface_hub import hf_hub_download
    WANT = {WANT}
    failed, wrong, right = [], [], []
    def one(i):
        for path in ({WEIGHTS!r}, {PIECES}[i % 4], "build/torch-universal/metadata.json"):
            try:
                got = hf_hub_download({HEAVY!r}, path, repo_type="kernel", revision="v1", cache_dir=f"{CACHE}/c{{i}}")
                (right if sha256_of(got) == WANT[path] else wrong).append(path)
            except Exception as e:
                failed.append(repr(e)[:300])
    threads = [threading.Thread(target=one, args=(i,)) for i in range(64)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    report({{"failed": failed, "wrong": wrong, "right": len(right)}})
"""
GET_KERNELS = """
    import os
    import kernels
    out = {}
    for repo in REPOS:
        k = kernels.get_kernel(repo, version=1)
        out[repo] = [k.VERSION, tree_sha256(os.path.dirname(k.__file__))]
    report(out)
"""


def test_64_clients_and_get_kernel_pulling_files_larger_than_the_free_space(upstream, tmp_path):
    """On an 8 MiB disk, 64 clients at once (huggingface_hub's hf_hub_download, each its own cache) ask for a
    10 MiB file, one of four 2 MiB ones and metadata.json: the big one never fits, pieces are stored until
    the disk is full; beside them kernels.get_kernel of the same kernel. Then, the disk filled to the last
    byte by a second writer (the ledger cannot be written either), get_kernel of relu (never asked before:
    its refs and listing held in memory) and of the same kernel again. 0 failed, 0 wrong bytes."""
    files = [WEIGHTS, *PIECES, f"build/{V}/metadata.json"]
    want = {p: hashlib.sha256(content(upstream, HEAVY, p)).hexdigest() for p in files}
    code = CLIENTS.format(WANT=json.dumps(want), WEIGHTS=WEIGHTS, PIECES=PIECES, HEAVY=HEAVY, CACHE=tmp_path / "c")
    with on_tmpfs(tmp_path, upstream, "8m") as (m, disk):
        kernels: dict = {}

        def get_kernels(name: str, *repos: str) -> None:
            code = f"    REPOS = {list(repos)!r}\n" + GET_KERNELS
            kernels[name] = run_client(code, m.url, tmp_path / name, timeout=600, HF_HUB_ETAG_TIMEOUT="60")

        side = threading.Thread(target=get_kernels, args=("hf-k1", HEAVY))
        side.start()
        timeouts = {"HF_HUB_ETAG_TIMEOUT": "60", "HF_HUB_DOWNLOAD_TIMEOUT": "60"}
        p, out = run_client(code, m.url, tmp_path / "hf", timeout=600, **timeouts)
        side.join()
        assert out is not None, p.stderr[-3000:]
        assert out["failed"] == [] and out["wrong"] == [], {**out, "failed": out["failed"][:3]}
        assert out["right"] == 64 * 3
        assert (sample(m.port, "frt_mirror_pull_seconds_count", kind="file", outcome="passed") or 0) >= 64

        fill(disk)
        get_kernels("hf-k2", HEAVY, RELU)
        for name in ("hf-k1", "hf-k2"):
            p, got = kernels[name]
            assert got is not None, p.stderr[-3000:]
            assert got[HEAVY][0] == 1 and got.get(RELU, [1])[0] == 1
            for path in files:
                assert got[HEAVY][1][path.split("/", 2)[2]] == want[path], (name, path)
        assert refs_from_memory(m.port) >= 1, "relu's refs, never asked before the disk filled: held in memory"
        status, _, _ = get(m.port, f"/api/kernels/{RELU}/refs")
        assert status == 200
        assert parts(disk) == []
        assert sample(m.port, "frt_mirror_disk_full") == 1
        log_checked(m.stderr())
