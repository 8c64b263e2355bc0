"""serve on an object store (`--store s3://…`): the blobs streamed from a real S3 server (SeaweedFS's weed)
to unmodified clients (kernels' get_kernel, huggingface_hub's snapshot_download and hf_hub_download; on
huggingface_hub 2.x here and 1.33 in the hub1 run), a Range answered from S3, and the integrity-on-read
promise kept there: an object with a flipped byte is never served whole, and is refused from then on."""

from __future__ import annotations

import hashlib
import time

import pytest

from tests.support.cli import cli_env, run_cli, stage_to
from tests.support.kernel_fixtures import ACTIVATION, LAYERNORM, RELU, X86_CPU
from tests.support.s3server import replica
from tests.support.serve_helpers import raw_http, raw_request, run_client

pytestmark = pytest.mark.hub1


def _staged_files(staged) -> list[tuple[str, bytes]]:
    return [(p, d) for p, d in staged["v1"][RELU].items() if p.startswith(f"build/{X86_CPU}/")]


@pytest.mark.parametrize("mode", ["streamed", "--s3-redirect"])
def test_get_kernel_and_snapshot_download_stream_from_the_bucket(s3_staged, tmp_path, mode):
    """Streamed through serve, or (--s3-redirect) a 302 to the object's presigned URL, which the clients
    follow to the S3 server as they follow the Hub's to its CDN; the HEAD is serve's own either way."""
    args = () if mode == "streamed" else ("--s3-redirect", "--access-log", str(tmp_path / "access.log"))
    with replica(tmp_path, s3_staged, "replica", *args) as served:
        p, out = run_client(
            f"""
            import kernels
            from huggingface_hub import hf_hub_download, snapshot_download
            ln = kernels.get_kernel({LAYERNORM!r}, version=1)
            snap = snapshot_download({RELU!r}, repo_type="kernel", revision="v1")
            files = tree_sha256(snap)
            so = hf_hub_download({ACTIVATION!r}, "build/{X86_CPU}/metadata.json", repo_type="kernel", revision="v1")
            report({{"ln": [ln.VARIANT, ln.add(2, 3)], "files": files, "meta": open(so, "rb").read().decode()}})
            """,
            served.url,
            tmp_path / "hf",
        )
        assert out is not None, p.stderr + served.stderr()
    assert out["ln"] == [X86_CPU, 5]
    want = s3_staged["v1"]
    staged = {p: d for p, d in want[RELU].items() if p.startswith(f"build/{X86_CPU}/")}  # the target's variant
    assert out["files"] == {path: hashlib.sha256(data).hexdigest() for path, data in staged.items()}
    assert out["meta"].encode() == want[ACTIVATION][f"build/{X86_CPU}/metadata.json"]
    if mode == "--s3-redirect":
        log = (tmp_path / "access.log").read_text()
        gets = [ln for ln in log.splitlines() if '"GET ' in ln and "/resolve/" in ln]
        assert gets and all(" 302 " in ln for ln in gets), gets[:5]


def test_s3_redirect_answers_as_the_hubs_cdn_redirect_and_never_to_bad_bytes(s3_staged, tmp_path, s3_server):
    """The 302 carries what the Hub's does (X-Repo-Commit, ETag, X-Linked-Etag/-Size for an LFS file) and a
    presigned Location whose bytes are the file's; an object found bad is a 500, never a redirect."""
    path, good = max(_staged_files(s3_staged), key=lambda x: len(x[1]))
    sha = hashlib.sha256(good).hexdigest()
    target = f"/kernels/{RELU}/resolve/v1/{path}"
    with replica(tmp_path, s3_staged, "replica", "--s3-redirect") as served:
        status, headers, body = raw_http(served.port, raw_request("GET", target))
        head, head_headers, _ = raw_http(served.port, raw_request("HEAD", target))
        assert status == 302 and body == b"", (status, headers)
        assert head == 200 and headers["x-repo-commit"] == head_headers["x-repo-commit"]
        assert headers["etag"] == head_headers["etag"]
        if len(good) >= 64 << 10:
            assert headers["x-linked-etag"] == f'"{sha}"' and headers["x-linked-size"] == str(len(good))
        assert "X-Amz-Signature=" in headers["location"]
        import urllib.request

        assert urllib.request.urlopen(headers["location"], timeout=10).read() == good
        raw = s3_server.store(s3_staged["store"])
        key = f"sha256/{sha[:2]}/{sha}"
        data = bytearray(raw.get(key).bytes())
        data[0] ^= 0x01
        raw.put(key, bytes(data))
    with replica(tmp_path, s3_staged, "replica2", "--s3-redirect") as served:  # a fresh one: nothing verified yet
        status, headers, _ = raw_http(served.port, raw_request("GET", target))
    assert status == 500 and "location" not in headers, (status, headers)


def test_a_range_is_answered_from_the_bucket(s3_staged, tmp_path):
    path, data = max(_staged_files(s3_staged), key=lambda x: len(x[1]))
    with replica(tmp_path, s3_staged) as served:
        target = f"/kernels/{RELU}/resolve/v1/{path}"
        status, headers, body = raw_http(served.port, raw_request("GET", target, "Range: bytes=5-104"))
        whole = raw_http(served.port, raw_request("GET", target))
    assert status == 206, (status, headers, served.stderr())
    assert body == data[5:105]
    assert headers["content-range"] == f"bytes 5-104/{len(data)}"
    assert whole[0] == 200 and whole[2] == data


def test_an_object_with_a_flipped_byte_is_never_served_whole_and_stage_puts_it_back(
    hub, s3_staged, tmp_path, s3_server
):
    """The object behind a file changed in the bucket (a bad disk, a careless hand): the GET that meets it
    is cut short before its last chunk (or a 500 before its first), and later ones are 500s. The object
    is quarantined as a bad file is (moved aside to PREFIX/quarantine/, recorded): verify names it, and
    `stage` fetches it again, which the same replica then serves whole."""
    raw = s3_server.store(s3_staged["store"])
    path, good = max(_staged_files(s3_staged), key=lambda x: len(x[1]))
    sha = hashlib.sha256(good).hexdigest()
    key = f"sha256/{sha[:2]}/{sha}"
    data = bytearray(raw.get(key).bytes())
    data[-1] ^= 0x01
    raw.put(key, bytes(data))
    target = f"/kernels/{RELU}/resolve/v1/{path}"
    with replica(tmp_path, s3_staged) as served:
        try:
            status, _, body = raw_http(served.port, raw_request("GET", target))
        except OSError:  # the connection closed short of Content-Length: cut, as it must be
            status, body = 200, b""
        assert status in (200, 500) and len(body) < len(good), (status, len(body), len(good))
        again, _, _ = raw_http(served.port, raw_request("GET", target))
        assert again == 500, served.stderr()
        deadline = time.monotonic() + 30  # moved aside, and said, in a thread of its own
        while "failed verification on read, quarantined" not in served.stderr():
            assert time.monotonic() < deadline, served.stderr()
            time.sleep(0.1)
        aside = raw.list("quarantine").collect()
        assert [o["size"] for o in aside] == [len(data)] and raw.list(key).collect() == []
        env = cli_env(FRT_LEDGER_URL=s3_staged["ledger"], FRT_STORE_URL=s3_staged["store"], **s3_staged["env"])
        p = run_cli("verify", home=tmp_path / "checker", env=env)
        assert p.returncode == 1 and f"missing blob {sha}" in p.stdout and "serve quarantined it" in p.stdout
        url = hub.start()
        p = stage_to(s3_staged["store"], s3_staged["ledger"], url, tmp_path / "m.toml", home=tmp_path / "s2", env=env)
        assert p.returncode == 0, p.stderr
        deadline = time.monotonic() + 30  # the replica looks for a quarantined object every RECHECK_S
        while (got := raw_http(served.port, raw_request("GET", target)))[0] != 200:
            assert got[0] == 500 and time.monotonic() < deadline, got[:2]
            time.sleep(0.5)
        assert got[2] == good
    assert run_cli("verify", home=tmp_path / "checker", env=env).returncode == 0


def test_serve_on_a_store_that_holds_none_of_the_staged_blobs_says_so_at_start(s3_staged, tmp_path):
    """A prefix mistyped (tried by hand: every file was then a 404 'not staged', which it is not): serve
    starts, and says at once that the store holds none of the blobs the staged rows need."""
    wrong = {**s3_staged, "store": s3_staged["store"] + "-typo"}
    with replica(tmp_path, wrong) as served:
        err = served.stderr()
    assert "warning: the store" in err and "holds 0 of the" in err and "is --store the stagers'" in err, err
    with replica(tmp_path, s3_staged, "right") as served:
        assert "holds 0 of the" not in served.stderr()


def test_an_object_put_back_under_a_new_etag_after_it_was_verified_is_still_served(s3_staged, tmp_path, s3_server):
    """The same bytes under a new ETag (gc'd and staged again, or re-uploaded in parts): a replica that
    verified the object under its old ETag verifies it afresh, and answers a Range and a whole GET, rather
    than a 503 from the store's 412 for the rest of FRT_SERVE_VERIFY_TTL."""
    path, data = max(_staged_files(s3_staged), key=lambda x: len(x[1]))
    sha = hashlib.sha256(data).hexdigest()
    raw, key = s3_server.store(s3_staged["store"]), f"sha256/{sha[:2]}/{sha}"
    target = f"/kernels/{RELU}/resolve/v1/{path}"
    with replica(tmp_path, s3_staged) as served:
        assert raw_http(served.port, raw_request("GET", target, "Range: bytes=0-9"))[0] == 206  # verified whole
        before = raw.head(key)["e_tag"]
        raw.put(key, data, use_multipart=True)  # one part: the same bytes, an ETag of another form
        assert raw.head(key)["e_tag"] != before
        for _ in range(2):
            status, _, body = raw_http(served.port, raw_request("GET", target, "Range: bytes=5-104"))
            assert (status, body) == (206, data[5:105]), (status, served.stderr())
            status, _, body = raw_http(served.port, raw_request("GET", target))
            assert (status, body) == (200, data), status
            raw.put(key, data, use_multipart=True)
