"""nginx in front of serve replicas on an object store (`--store s3://…`): each replica has a home of its
own, the blobs are in a real S3 server (SeaweedFS's weed), the ledger on a real PostgreSQL.

- `nginx-conf --store s3://…` with `serve --accel-redirect`: nginx fetches each body from the store by the
  presigned URL a replica hands it (If-Match the ETag the replica verified), never through a replica;
  answers header for header serve's own, a flipped byte never served whole, real clients through it.
- A replica SIGKILLed, or the ledger's PostgreSQL stopped, under 64 clients: no request fails, no wrong bytes.
Also in the huggingface_hub 1.33 venv (marked hub1).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import signal
from pathlib import Path

import pytest

from tests.support.cli import X86, cli_env, run_cli, stage_to, write_manifest
from tests.support.kernel_fixtures import ACTIVATION, LAYERNORM, RELU, X86_CPU
from tests.support.load import hub_files, load
from tests.support.nginx import PREFIX, Front, answer, nginx, nginx_conf, nginx_t, wait_for_lines
from tests.support.s3server import replica
from tests.support.serve_helpers import free_port, raw_http, raw_request, run_client

pytestmark = pytest.mark.hub1


def _env(staged) -> dict:
    return cli_env(FRT_LEDGER_URL=staged["ledger"], FRT_STORE_URL=staged["store"], **staged["env"])


@contextlib.contextmanager
def s3_front(tmp_path: Path, staged: dict, accel: bool, n: int = 2):
    """n replicas with homes of their own on `staged`'s bucket and ledger, each logging to a file, behind
    nginx-conf's nginx: with `accel`, nginx-conf --store and serve --accel-redirect (nginx fetches bodies from
    the store); without, a plain front (the replicas stream them)."""
    run = tmp_path / "nginx"
    run.mkdir()
    with contextlib.ExitStack() as stack:
        replicas = [
            stack.enter_context(
                replica(
                    tmp_path,
                    staged,
                    f"replica{i}",
                    "--access-log",
                    str(run / f"replica{i}.log"),
                    *(("--accel-redirect", PREFIX) if accel else ()),
                )
            )
            for i in range(n)
        ]
        env = _env(staged) if accel else None
        conf = nginx_conf(tmp_path / "replica0", [r.port for r in replicas], free_port(), run, env=env)
        yield stack.enter_context(nginx(conf, run, replicas))


def _variant_files(staged, repo: str) -> dict[str, bytes]:
    """The files of `repo`'s staged variant at v1 (activation's: an LFS .so among them)."""
    return {p: d for p, d in staged["v1"][repo].items() if p.startswith(f"build/{X86_CPU}/")}


def _verified_by_every_replica(front: Front, urls) -> None:
    """A replica hands nginx an object only once it verified it whole: a GET of each at each replica."""
    for r in front.replicas:
        for url in urls:
            assert raw_http(r.port, raw_request("GET", url))[0] == 200


def test_nginx_conf_on_the_store_names_its_endpoint_and_passes_nginx_t(s3_staged, tmp_path, s3_server):
    env = _env(s3_staged)
    p = run_cli("nginx-conf", "--run-dir", str(tmp_path / "run"), home=tmp_path / "h", env=env)
    assert p.returncode == 0, p.stderr
    conf = p.stdout
    host_port = s3_server.endpoint.removeprefix("http://")
    assert f"server {host_port};" in conf and f'proxy_set_header Host "{host_port}";' in conf
    assert f"--store {s3_staged['store']} serve" in conf and "alias" not in conf
    (tmp_path / "run").mkdir()
    t = nginx_t(conf, tmp_path)
    assert t.returncode == 0, t.stderr
    p = run_cli("nginx-conf", "--head-map", home=tmp_path / "h", env=env)
    assert p.returncode == 2 and len(p.stderr.splitlines()) == 1 and "--head-map" in p.stderr, p.stderr


def test_nginx_fetches_bodies_from_the_store_and_answers_as_serve(s3_staged, tmp_path):
    """Header for header and byte for byte serve's answer alone, the Ranges nginx passes to the store
    included; the replicas sent headers only (their access logs: 0 bytes) for every body nginx fetched."""
    files = _variant_files(s3_staged, ACTIVATION)
    big = max(files, key=lambda p: len(files[p]))
    assert len(files[big]) >= 64 << 10  # an LFS file: X-Linked-* on the answers
    base = f"/kernels/{ACTIVATION}/resolve/v1/"
    cases = [("GET", base + p, []) for p in sorted(files)] + [
        ("HEAD", base + big, []),
        *[("GET", base + big, [f"Range: bytes={r}"]) for r in ("5-104", "1000-", "-7", "0-")],
    ]
    with s3_front(tmp_path, s3_staged, accel=True) as front:
        _verified_by_every_replica(front, [base + p for p in files])
        alone = replica(tmp_path, s3_staged, "alone")
        with alone as served:
            for i, (method, path, headers) in enumerate(cases):
                tagged = f"{path}?case={i}"
                want = answer(served.port, method, tagged, headers)
                got = answer(front.port, method, tagged, headers)
                assert got == want, (method, path, headers, got[:2], want[:2])
        assert answer(front.port, "GET", base + big, [])[2] == files[big]
        lines = wait_for_lines(front, lambda ln: "case=" in ln["path"], len(cases))
    assert sorted(int(ln["bytes"]) for ln in lines) == [0] * len(cases), lines
    assert {ln["status"] for ln in lines} == {"200"}


def test_an_object_replaced_after_it_was_verified_is_never_served_whole_by_nginx(s3_staged, tmp_path, s3_server):
    """A replica verified the object; then a byte of it flips in the bucket. nginx asks the store If-Match
    the verified ETag, gets a 412, and has a replica stream it instead, hashing: cut short (or a 500), and
    a 500 from then on. Never the flipped bytes whole."""
    files = _variant_files(s3_staged, ACTIVATION)
    big = max(files, key=lambda p: len(files[p]))
    url = f"/kernels/{ACTIVATION}/resolve/v1/{big}"
    sha = hashlib.sha256(files[big]).hexdigest()
    with s3_front(tmp_path, s3_staged, accel=True) as front:
        _verified_by_every_replica(front, [url])
        assert raw_http(front.port, raw_request("GET", url))[2] == files[big]
        raw, key = s3_server.store(s3_staged["store"]), f"sha256/{sha[:2]}/{sha}"
        data = bytearray(raw.get(key).bytes())
        data[len(data) // 2] ^= 0x01
        raw.put(key, bytes(data))
        try:
            status, _, body = raw_http(front.port, raw_request("GET", url))
        except OSError:  # the connection closed short of Content-Length: cut, as it must be
            status, body = 200, b""
        assert status in (200, 500) and len(body) < len(data), (status, len(body))
        again = raw_http(front.port, raw_request("GET", url))
        assert again[0] == 500 and again[2] != bytes(data), again[:2]


def test_get_kernel_and_snapshot_download_through_nginx_on_the_store(s3_staged, tmp_path):
    files = _variant_files(s3_staged, RELU)
    with s3_front(tmp_path, s3_staged, accel=True) as front:
        script = f"""
            import kernels
            from huggingface_hub import snapshot_download
            ln = kernels.get_kernel({LAYERNORM!r}, version=1)
            snap = snapshot_download({RELU!r}, repo_type="kernel", revision="v1")
            report({{"ln": [ln.VARIANT, ln.add(2, 3)], "files": tree_sha256(snap)}})
            """
        for run in ("first", "again"):  # first: the replicas stream (and verify); again: nginx fetches
            p, out = run_client(script, front.url, tmp_path / f"hf-{run}")
            assert out is not None, p.stderr + front.error_log()[-2000:]
            assert out["ln"] == [X86_CPU, 5]
            assert out["files"] == {path: hashlib.sha256(data).hexdigest() for path, data in files.items()}
        relu_get = lambda ln: ln["method"] == "GET" and f"{RELU}/resolve/" in ln["path"]  # noqa: E731
        gets = wait_for_lines(front, relu_get, 2 * len(files))
    assert any(int(ln["bytes"]) == 0 for ln in gets), "some bodies went from the store through nginx"


def test_two_replicas_behind_nginx_one_killed_under_load_fail_no_request(
    big_hub, tmp_path, pg_url, s3_server, s3_store
):
    """Two serve replicas, each with a home of its own, on one bucket and one ledger, behind nginx-conf
    --store's nginx; 64 keep-alive clients HEAD + GET every staged file (a multi-MiB one among them: a
    replica streams and hashes it the first time, nginx fetches it from S3 after); one replica is SIGKILLed
    half-way: no request fails and every body is right. (Behind a plain front, one whose replicas stream
    every body, a replica killed mid-body cuts that answer: nginx cannot retry a body it began to send.)"""
    staged, files = _big_site(big_hub, tmp_path, pg_url, s3_server, s3_store)
    with s3_front(tmp_path, staged, accel=True) as front:
        victim = front.replicas[0]
        out = asyncio.run(load(front.port, files, clients=64, rounds=2, kill=victim.proc.kill))
        assert victim.proc.wait(timeout=30) == -signal.SIGKILL
        assert front.replicas[1].proc.poll() is None
        errors = front.error_log()
    assert out["failures"] == [], out["failures"][:10]
    assert out["total"] == 64 * 2 * len(files) * 2 and out["after"] > 0
    assert "upstream" in errors  # nginx did meet the dead replica, and went on to the other


def test_the_ledger_stopped_under_load_fails_no_request(big_hub, tmp_path, pg_server, pg_url, s3_server, s3_store):
    """The same front and load; half-way the ledger's PostgreSQL stops (pg_ctl stop: every connection
    closed), and a second load runs with it down. The replicas answer from the catalog they hold and the
    bucket: no request fails, no byte is wrong."""
    import threading

    staged, files = _big_site(big_hub, tmp_path, pg_url, s3_server, s3_store)
    stopper = threading.Thread(target=pg_server.stop)  # off the load's event loop: pg_ctl waits
    try:
        with s3_front(tmp_path, staged, accel=True) as front:
            out = asyncio.run(load(front.port, files, clients=64, rounds=2, kill=stopper.start))
            stopper.join()
            assert not pg_server.running
            out2 = asyncio.run(load(front.port, files, clients=16, rounds=1, kill=lambda: None))  # all of it down
            stderr = [r.stderr() for r in front.replicas]
    finally:
        if stopper.is_alive():
            stopper.join()
        pg_server.start()
    assert out["failures"] == [] and out2["failures"] == [], (out["failures"] + out2["failures"])[:10]
    assert out["after"] > 0 and out2["total"] == 16 * len(files) * 2
    assert all("Traceback" not in e for e in stderr), stderr


def _big_site(big_hub, tmp_path, pg_url, s3_server, s3_store) -> tuple[dict, list]:
    """big v1 (a multi-MiB file) and relu v1 staged for x86 into the bucket; the upstream then stopped.
    (The site as s3_staged gives it, and every staged file as a client asks for it.)"""
    from tests.support.big_kernel import BIG

    manifest = write_manifest(tmp_path / "m.toml", {BIG: {"version": 1}, RELU: {"version": 1}}, [X86])
    env = cli_env(**s3_server.env())
    p = stage_to(s3_store, pg_url, big_hub.url, manifest, home=tmp_path / "stager", env=env, json=True)
    assert p.returncode == 0, p.stderr
    files = hub_files(big_hub, json.loads(p.stdout)["rows"])
    assert any(f.size > 1 << 20 for f in files), "a file of several chunks, streamed and hashed"
    big_hub.stop()
    return {"ledger": pg_url, "store": s3_store, "env": s3_server.env()}, files
