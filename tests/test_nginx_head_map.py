"""`nginx-conf --head-map` with replicas started `serve --head-map RUN_DIR`: nginx answers every HEAD of a
stored file by commit sha itself, header for header as serve alone answers it, and follows the ledger
(a new commit answered, an unstaged one no longer) within a poll and a reload. The real nginx
(tests/support/nginx.py); the replicas' access logs say which requests reached them."""

from __future__ import annotations

import hashlib
import subprocess
import time

import pytest

from tests.support.cli import X86, run_cli, write_manifest
from tests.support.kernel_fixtures import ACTIVATION, RELU, X86_CPU
from tests.support.nginx import NGINX, answer, front_of, nginx_conf, replica_lines, wait_for_lines
from tests.support.serve_helpers import free_port, raw_http, raw_request, replica_env, run_client

pytestmark = pytest.mark.hub1


def v1(staged, repo: str) -> str:
    return staged.repos[repo].branches["v1"]


def by_sha(staged, repo: str) -> list[str]:
    sha = v1(staged, repo)
    return [f"/kernels/{repo}/resolve/{sha}/{p}" for p in sorted(staged.repos[repo].commits[sha].files)]


def test_nginx_answers_heads_by_sha_itself_as_serve(serve_staged, serve_mirror, tmp_path):
    """Every stored file's HEAD by sha, from nginx alone, equal to serve's; anything else a map cannot
    answer as serve would (a branch, a Range, a condition, a token, a query, a GET) reaches a replica."""
    run = tmp_path / "nginx"
    urls = [u for u in by_sha(serve_staged, ACTIVATION) if answer(serve_mirror.port, "HEAD", u, [])[0] == 200]
    assert len(urls) >= 3  # what is staged of it (one variant, and the repo's top-level files)
    first = next(u for u in urls if u.endswith(".so"))
    etag = dict(answer(serve_mirror.port, "HEAD", first, [])[1])["etag"]
    reach = [
        ("HEAD", first.replace(v1(serve_staged, ACTIVATION), "v1"), []),
        ("HEAD", first, ["Range: bytes=10-19"]),
        ("HEAD", first, [f"If-None-Match: {etag}"]),
        ("HEAD", first, ["Authorization: Bearer x"]),
        ("HEAD", f"{first}?x=1", []),
        ("GET", first, []),
    ]
    # A map an older replica wrote (values "blob|ETag|…", read by configs of that time) is not this config's.
    (run / "heads").mkdir(parents=True)
    (run / "heads" / "current.map").write_text(f'"{first}" \'aa/{"a" * 64}|"x"|||{"0" * 40}\';\n')
    with front_of(serve_staged.home, run, conf_args=("--head-map",), serve_args=("--head-map", str(run))) as front:
        assert (run / "heads" / "current.answers").stat().st_size > 0  # written before the replica answered
        for url in urls:
            alone = answer(serve_mirror.port, "HEAD", url, [])
            assert [answer(front.port, "HEAD", url, []) for _ in range(2)] == [alone] * 2, url
        for method, path, headers in reach:
            alone = answer(serve_mirror.port, method, path, headers)
            assert answer(front.port, method, path, headers) == alone, (method, path, headers)
        lines = wait_for_lines(front, lambda ln: "/resolve/" in ln["path"], len(reach))
        time.sleep(0.5)  # any line a by-sha HEAD would have left is out by now
        lines = [ln for ln in replica_lines(front) if "/resolve/" in ln["path"]]
    assert sorted((ln["method"], ln["path"]) for ln in lines) == sorted((m, p) for m, p, _ in reach)


def test_the_map_follows_the_ledger_within_a_second(hub, tmp_path):
    """A commit staged after nginx started is answered by nginx itself, and one unstaged is no longer
    (a replica's 404), within a second of the command that changed the ledger, through both replicas'
    nginx (each replica writes the map; nginx reloads on the change)."""
    home, run = tmp_path / "home", tmp_path / "nginx"
    for repo in (RELU, ACTIVATION):
        write_manifest(tmp_path / f"{repo.split('/')[1]}.toml", {repo: {"version": 1}}, [X86])
    assert run_cli("--endpoint", hub.url, "stage", str(tmp_path / "relu.toml"), home=home).returncode == 0
    env = replica_env(FRT_SERVE_POLL="0.1")
    with front_of(home, run, conf_args=("--head-map",), serve_args=("--head-map", str(run)), env=env) as front:
        p = run_cli("--endpoint", hub.url, "stage", str(tmp_path / "activation.toml"), home=home)
        assert p.returncode == 0, p.stderr
        t0 = time.monotonic()
        sha = hub.repos[("kernel", ACTIVATION)].branches["v1"]
        while ACTIVATION not in (run / "heads" / "current.answers").read_text():
            assert time.monotonic() - t0 < 1.0, "the map did not take the new commit within a second"
            time.sleep(0.02)
        keys = [ln.split('"')[1] for ln in (run / "heads" / "current.answers").read_text().splitlines()]
        url = next(k for k in keys if k.startswith(f"/kernels/{ACTIVATION}/resolve/{sha}/") and k.endswith(".so"))
        deadline = t0 + 1.0
        # the replica that wrote the map saw the change; this one may poll the ledger a moment later
        while (direct := answer(front.replicas[0].port, "HEAD", url, []))[0] != 200:
            assert time.monotonic() < deadline, f"a replica did not answer the new commit within a second: {direct}"
            time.sleep(0.02)
        while answer(front.port, "HEAD", url, []) != direct or not nginx_alone(front, url):
            assert time.monotonic() < deadline, "nginx did not answer the new commit itself within a second"
            time.sleep(0.02)
        p = run_cli("unstage", ACTIVATION, home=home)
        assert p.returncode == 0, p.stderr
        t0 = time.monotonic()
        while raw_http(front.port, raw_request("HEAD", url))[0] != 404:
            assert time.monotonic() - t0 < 1.0, "nginx still answered an unstaged file after a second"
            time.sleep(0.02)
        assert ACTIVATION not in (run / "heads" / "current.answers").read_text()
        for replica in front.replicas:
            assert replica.proc.poll() is None, replica.stderr()


def nginx_alone(front, url: str) -> bool:
    """Whether a HEAD of `url` now leaves no line in either replica's log (nginx answered it)."""
    before = sum(1 for ln in replica_lines(front) if ln["path"] == url)
    raw_http(front.port, raw_request("HEAD", url))
    time.sleep(0.3)  # a replica's line goes out at its loop's next turn
    return sum(1 for ln in replica_lines(front) if ln["path"] == url) == before


@pytest.mark.parametrize("flags", [("--head-map",), ("--head-map", "--head-cache", "5")])
def test_nginx_accepts_the_config_with_either_or_both(serve_staged, tmp_path, flags):
    """`nginx -t` on the config, --head-map alone and with --head-cache (nginx wants map_hash_* before
    any map: with both, the head cache's map came first once)."""
    run = tmp_path / "run"
    run.mkdir()
    conf = tmp_path / "nginx.conf"
    conf.write_text(nginx_conf(serve_staged.home, [free_port()], free_port(), run, *flags))
    t = subprocess.run([NGINX, "-t", "-c", str(conf), "-e", str(run / "error.log")], capture_output=True, text=True)
    assert t.returncode == 0, t.stderr


def test_real_clients_through_the_head_map(serve_staged, tmp_path):
    """Unmodified snapshot_download and kernels.get_kernel through a --head-map front: the staged bytes,
    every HEAD they sent by commit sha answered by nginx itself (nginx's log has them, no replica's)."""
    run = tmp_path / "nginx"
    commit = serve_staged.repos[ACTIVATION].commits[v1(serve_staged, ACTIVATION)]
    with front_of(serve_staged.home, run, conf_args=("--head-map",), serve_args=("--head-map", str(run))) as front:
        p, out = run_client(
            f"""
            import os, kernels
            from huggingface_hub import snapshot_download
            act = snapshot_download({ACTIVATION!r}, repo_type="kernel", revision="v1")
            a1 = kernels.get_kernel({ACTIVATION!r}, version=1)
            report({{"act": [os.path.basename(act), tree_sha256(act)], "a1": [a1.VARIANT, a1.REVISION_NOTE]}})
        """,
            front.url,
            tmp_path / "hf",
        )
        time.sleep(0.5)  # a replica's line goes out at its loop's next turn
        reached = [ln for ln in replica_lines(front) if ln["method"] == "HEAD" and commit.sha in ln["path"]]
    assert out is not None, p.stderr[-3000:]
    staged = {f: hashlib.sha256(commit.files[f]).hexdigest() for f in commit.files if f.startswith(f"build/{X86_CPU}/")}
    assert out["act"] == [commit.sha, staged]
    assert out["a1"] == [X86_CPU, "cu-rebuild"]
    # nginx's own log, written out when it stopped: the by-sha HEADs the clients sent, none of them a replica's.
    heads = [
        ln
        for ln in (run / "access.log").read_text().splitlines()
        if f'"HEAD /kernels/{ACTIVATION}/resolve/{commit.sha}/' in ln
    ]
    assert len(heads) >= len(staged) and all('" 200 ' in ln for ln in heads), heads
    assert reached == []
