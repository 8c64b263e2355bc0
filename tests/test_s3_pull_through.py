"""Pull-through onto an object store (`serve --upstream URL --allow ORG` with `--store s3://…`): what a
replica fetches on a miss is verified on its host, uploaded to the bucket and recorded in the ledger, and
from then on every replica (each with a home of its own) serves it from the bucket, also with the
upstream gone. A real S3 server (SeaweedFS's weed), a real PostgreSQL, unmodified clients (kernels'
get_kernel, huggingface_hub's hf_hub_download) in subprocesses, on huggingface_hub 2.x here and 1.33 in
the hub1 run; the upstream is the fake Hub with the real Hub's redirects to a CDN host."""

from __future__ import annotations

import contextlib
import hashlib
import time

import pytest

from tests.support.cli import X86, cli_env, run_cli
from tests.support.fakehub import FakeHub
from tests.support.kernel_fixtures import ACTIVATION, ORG, X86_CPU, demo_repos
from tests.support.serve_helpers import read_held_stream, run_client, serve_env, serving
from tests.support.serve_home import BIG, BIG_FILE, BIG_SIZE, big_repo

pytestmark = pytest.mark.hub1

GET_BOTH = f"""
    import kernels
    a = kernels.get_kernel("{ACTIVATION}", version=1)
    b = kernels.get_kernel("{ACTIVATION}", version=2)
    report({{"v1": [a.VERSION, a.REVISION_NOTE, a.VARIANT], "v2": [b.VERSION, b.REVISION_NOTE, b.VARIANT]}})
"""


@pytest.fixture
def upstream():
    with FakeHub(demo_repos() + [big_repo()], trusted_orgs=[ORG], page_size=5, redirects=True) as hub:
        yield hub


@pytest.fixture
def site(pg_url, s3_server, s3_store) -> dict[str, str]:
    """What every replica and command of the site is given: the bucket, the ledger, the store's endpoint."""
    return {"FRT_STORE_URL": s3_store, "FRT_LEDGER_URL": pg_url, **s3_server.env()}


def pulled(home, upstream: str, site: dict):
    return serving(
        home,
        "--upstream",
        upstream,
        "--allow",
        ORG,
        "--upstream-timeout",
        "30",
        env=serve_env(**site),
    )


def client(code: str, url: str, hf_home):
    return run_client(code, url, hf_home, timeout=180, HF_HUB_ETAG_TIMEOUT="60")


def test_what_one_replica_pulls_every_replica_serves_from_the_bucket(upstream, tmp_path, site, s3_server):
    with pulled(tmp_path / "a", upstream.url, site) as a:
        p, out = client(GET_BOTH, a.url, tmp_path / "hf-a")
        assert out == {"v1": [1, "cu-rebuild", X86_CPU], "v2": [2, "v2.1", X86_CPU]}, p.stderr[-3000:] + a.stderr()
    objects = s3_server.store(site["FRT_STORE_URL"]).list("sha256").collect()
    assert objects and not list((tmp_path / "a").rglob("views")), "no views: the blobs are objects"
    url = upstream.url
    upstream.stop()
    with pulled(tmp_path / "b", url, site) as b:  # another host: its own home, the upstream gone
        p, out = client(GET_BOTH, b.url, tmp_path / "hf-b")
        assert out == {"v1": [1, "cu-rebuild", X86_CPU], "v2": [2, "v2.1", X86_CPU]}, p.stderr[-3000:] + b.stderr()
    env = cli_env(**site)
    p = run_cli("verify", home=tmp_path / "c", env=env)
    assert p.returncode == 0, p.stderr
    into = ["--into", str(tmp_path / "kernels")]  # v1 and v2 were pulled: LOCAL_KERNELS takes the one chosen
    p = run_cli("env", "--target", X86, "--version", f"{ACTIVATION}=2", *into, home=tmp_path / "c", env=env)
    assert p.returncode == 0 and ACTIVATION.split("/")[1] in p.stdout, p.stderr


def test_a_big_cold_file_streams_while_fetched_then_every_replica_serves_it_from_the_bucket(upstream, tmp_path, site):
    """The first client gets bytes while the upstream still holds the file (the `.part` as it grows); the
    last ones once the part hashes to its name, uploaded. Then another replica's client gets it from S3."""
    repo = upstream.repos[("kernel", BIG)]
    want = hashlib.sha256(repo.commits[repo.branches["v1"]].files[BIG_FILE]).hexdigest()
    held = 12 << 20
    upstream.faults.hold("_weights.bin", held)
    with pulled(tmp_path / "a", upstream.url, site) as a, contextlib.ExitStack() as done:
        done.callback(upstream.faults.release)  # a failing test must not leave the upstream held
        url = f"/kernels/{BIG}/resolve/v1/{BIG_FILE}"
        headers, body, before = read_held_stream(a.port, url, held, upstream.faults.release)
        assert int(headers["content-length"]) == BIG_SIZE and before < BIG_SIZE, headers
        assert hashlib.sha256(body).hexdigest() == want, a.stderr()
    url = upstream.url
    upstream.stop()
    with pulled(tmp_path / "b", url, site) as b:
        p, out = client(
            f"""
            from huggingface_hub import hf_hub_download
            report(sha256_of(hf_hub_download({BIG!r}, {BIG_FILE!r}, repo_type="kernel", revision="v1")))
            """,
            b.url,
            tmp_path / "hf",
        )
        assert out == want, p.stderr[-3000:] + b.stderr()


def test_an_object_found_bad_is_quarantined_and_pulled_again(upstream, tmp_path, site, s3_server):
    """A pulled object's byte flips in the bucket: the GET that meets it is cut short (or a 500), the
    object is moved aside to PREFIX/quarantine/, and the next request pulls it again from the upstream:
    the right bytes, and verify clean."""
    from tests.support.kernel_fixtures import RELU
    from tests.support.serve_helpers import raw_http, raw_request

    repo = upstream.repos[("kernel", RELU)]
    path, good = max(
        ((p, d) for p, d in repo.commits[repo.branches["v1"]].files.items() if d and X86_CPU in p),
        key=lambda x: len(x[1]),
    )
    sha = hashlib.sha256(good).hexdigest()
    raw, key = s3_server.store(site["FRT_STORE_URL"]), f"sha256/{sha[:2]}/{sha}"
    target = f"/kernels/{RELU}/resolve/v1/{path}"  # timeouts: a cold pull on a loaded box can pass 10 s
    with pulled(tmp_path / "a", upstream.url, site) as a:
        assert raw_http(a.port, raw_request("GET", target), timeout=60)[2] == good  # pulled, uploaded
    data = bytearray(raw.get(key).bytes())
    data[0] ^= 0x01
    raw.put(key, bytes(data))
    with pulled(tmp_path / "b", upstream.url, site) as b:  # a fresh replica: nothing verified yet
        try:
            status, _, body = raw_http(b.port, raw_request("GET", target), timeout=60)
        except OSError:  # cut short of Content-Length
            status, body = 200, b""
        assert body != bytes(data) and (status == 500 or len(body) < len(data)), status
        deadline = time.monotonic() + 30
        while (got := raw_http(b.port, raw_request("GET", target), timeout=60))[
            0
        ] != 200:  # once moved aside: pulled again
            assert time.monotonic() < deadline, (got[:2], b.stderr())
            time.sleep(0.2)
        assert got[2] == good
        assert [o["size"] for o in raw.list("quarantine").collect()] == [len(data)]
    p = run_cli("verify", home=tmp_path / "c", env=cli_env(**site))
    assert p.returncode == 0, p.stdout + p.stderr
