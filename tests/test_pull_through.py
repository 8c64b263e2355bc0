"""Pull-through (`serve --upstream URL --allow ORG`): an empty home that fetches on first use, verifies,
keeps, and serves it from then on, also with the upstream gone. Unmodified clients (kernels'
get_kernel, huggingface_hub's hf_hub_download / snapshot_download, transformers) in subprocesses; the
upstream is the fake Hub with the real Hub's redirects to a CDN host. Also in the huggingface_hub 1.33
venv (marked hub1)."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.cli import X86, run_cli, run_cli_process
from tests.support.fakehub import FakeHub, FakeRepo
from tests.support.kernel_fixtures import ACTIVATION, ORG, X86_CPU, build, demo_repos
from tests.support.model_fixtures import TINY_MODEL, tiny_model_repo, write_tiny_model
from tests.support.offline import load_offline
from tests.support.serve_helpers import (
    raw_http,
    raw_request,
    read_held_stream,
    read_response_head,
    run_client,
    serve_env,
    serving,
)
from tests.support.serve_home import BIG, BIG_FILE, BIG_SIZE, big_repo

pytestmark = pytest.mark.hub1

MODEL_ORG = TINY_MODEL.split("/")[0]


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory) -> Path:
    """The tiny model, written once (it takes torch and transformers a while)."""
    out = tmp_path_factory.mktemp("pull") / "saved"
    write_tiny_model(out)
    return out


DATASET = f"{MODEL_ORG}/tiny-dataset"
TRAIN = b"text,label\n" + b"".join(b"row %d,%d\n" % (i, i % 2) for i in range(2000))


def dataset_repo() -> FakeRepo:
    repo = FakeRepo(DATASET, repo_type="dataset")
    repo.commit({"README.md": b"# tiny\n", "data/train.csv": TRAIN, "data/test.csv": TRAIN[:400]}, title="data")
    return repo


def upstream_hub(saved: Path) -> FakeHub:
    return FakeHub(
        demo_repos() + [big_repo(), tiny_model_repo(saved), dataset_repo()],
        trusted_orgs=[ORG],
        page_size=5,
        redirects=True,
    )


@pytest.fixture
def upstream(saved_model):
    with upstream_hub(saved_model) as hub:
        yield hub


def pulled(home: Path, upstream: FakeHub, *args: str):
    """serve --upstream. A cold request waits for the upstream's listing: on a loaded 2-core box that can
    pass the 5 s default, so the tests that do not time the upstream give it 30 s (a later option wins)."""
    return serving(
        home,
        "--upstream",
        upstream.url,
        "--allow",
        ORG,
        "--allow",
        MODEL_ORG,
        "--upstream-timeout",
        "30",
        *args,
        env=serve_env(),
    )


def client(code: str, url: str, hf_home: Path, timeout: float = 180, **extra: str):
    """run_client, with huggingface_hub's HEAD timeout (10 s) raised past the mirror's own waits."""
    return run_client(code, url, hf_home, timeout=timeout, **{"HF_HUB_ETAG_TIMEOUT": "60", **extra})


GET_BOTH = f"""
    import kernels
    a = kernels.get_kernel("{ACTIVATION}", version=1)
    b = kernels.get_kernel("{ACTIVATION}", version=2)
    report({{"v1": [a.VERSION, a.REVISION_NOTE, a.VARIANT], "v2": [b.VERSION, b.REVISION_NOTE, b.VARIANT]}})
"""


def body_transfers(hub: FakeHub, sha256: str) -> list:
    """The upstream's answers that carried an LFS file's bytes: the CDN's, behind the Hub's redirect."""
    return [
        e
        for e in hub.request_log
        if e.server == "cdn"
        and e.method == "GET"
        and e.path.split("?")[0] == f"/cdn/{sha256}"
        and e.status in (200, 206)
    ]


def test_get_kernel_v1_and_v2_on_first_use_then_an_ordinary_staged_set(upstream, tmp_path):
    home = tmp_path / "home"
    with pulled(home, upstream) as m:
        p, out = client(GET_BOTH, m.url, tmp_path / "hf")
        assert out == {"v1": [1, "cu-rebuild", X86_CPU], "v2": [2, "v2.1", X86_CPU]}, p.stderr[-3000:]
        # Exactly the files the client asked for crossed the wire: the chosen variant's, once each.
        gets = [
            e.path
            for e in upstream.request_log
            if e.method == "GET" and e.server == "hub" and "/resolve/" in e.path and "metadata.json" not in e.path
        ]
        assert gets and all(X86_CPU in g for g in gets) and len(gets) == len(set(gets)), gets
        # /metrics counts the pulls: one refs refresh at least, and the files with their bytes.
        status, _, body = raw_http(m.port, raw_request("GET", "/metrics"))
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(body.decode())
            for s in fam.samples
        }
        files = samples.get(("frt_mirror_pull_seconds_count", (("kind", "file"), ("outcome", "ok"))), 0)
        pulled_bytes = samples.get(("frt_mirror_pull_bytes_total", (("kind", "file"), ("outcome", "ok"))), 0)
        assert status == 200 and files >= 6 and pulled_bytes > 96 * 1024, sorted(k for k in samples if "pull" in k[0])
    # What was pulled is staged: verify, env, export-cache (loaded offline), bundle + import elsewhere.
    assert run_cli("verify", home=home).returncode == 0
    p = run_cli("env", "--target", X86, "--version", f"{ACTIVATION}=2", home=home)  # v1 and v2 were pulled
    assert p.returncode == 0 and "activation" in p.stdout, p.stderr
    cache = tmp_path / "cache"
    p = run_cli("export-cache", str(cache), "--target", X86, home=home)
    assert p.returncode == 0, p.stderr
    p = load_offline(
        f"""
        import kernels
        k = kernels.get_kernel("{ACTIVATION}", version=2)
        assert (k.VERSION, k.REVISION_NOTE) == (2, "v2.1"), k.REVISION_NOTE
    """,
        {"HF_HUB_CACHE": str(cache)},
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert run_cli("bundle", str(tmp_path / "b.tar"), home=home).returncode == 0
    other = tmp_path / "other"
    p = run_cli("import", str(tmp_path / "b.tar"), home=other)
    assert p.returncode == 0, p.stderr
    assert run_cli("verify", home=other).returncode == 0


def test_a_repo_outside_the_allow_list_is_not_found_and_never_asked_for(upstream, tmp_path):
    with serving(tmp_path / "home", "--upstream", upstream.url, "--allow", ORG, env=serve_env()) as m:
        p, out = client(
            f"""
            from huggingface_hub import hf_hub_download
            from huggingface_hub.errors import RepositoryNotFoundError
            try:
                hf_hub_download({TINY_MODEL!r}, "config.json")
                report("downloaded")
            except RepositoryNotFoundError as e:
                report("RepositoryNotFoundError")
        """,
            m.url,
            tmp_path / "hf",
        )
        assert out == "RepositoryNotFoundError", p.stderr[-2000:]
    assert not [e for e in upstream.request_log if TINY_MODEL in e.path]


def test_a_file_the_upstream_lists_but_answers_404_for_is_a_502_and_nothing_is_stored(upstream, tmp_path):
    """The upstream's listing and its answer disagree (ListedFileRefused): the client is told the mirror
    stored nothing (502, which it may retry), not that the file does not exist (a 404 it would believe)."""
    upstream.faults.fail_next(100, status=404, match="config.json")
    with pulled(tmp_path / "home", upstream) as m:
        status, headers, _ = raw_http(m.port, raw_request("GET", f"/{TINY_MODEL}/resolve/main/config.json"), 60)
        assert status == 502, (status, headers)
        assert "nothing was stored" in headers["x-error-message"] and "answers 404" in headers["x-error-message"]
        upstream.faults.clear()
        status, _, body = raw_http(m.port, raw_request("GET", f"/{TINY_MODEL}/resolve/main/config.json"), 60)
        assert status == 200 and body, "the next request asks again"


def test_upstream_and_allow_go_together(upstream, tmp_path):
    # In a process: a serve that did start would not return, and a process times out.
    for args in (["--upstream", upstream.url], ["--allow", ORG]):
        p = run_cli_process("serve", *args, home=tmp_path / "home")
        assert p.returncode == 2 and "--allow" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    p = run_cli_process("serve", "--upstream", "ftp://mirror", "--allow", ORG, home=tmp_path / "home")
    assert p.returncode == 2 and p.stderr.startswith("frt-mirror: --upstream 'ftp://mirror' is not an upstream URL")


CONCURRENT = f"""
    import hashlib, threading
    from huggingface_hub import hf_hub_download
    results, errors = [], []
    def one(i):
        try:
            path = hf_hub_download({BIG!r}, {BIG_FILE!r}, repo_type="kernel", revision="v1",
                                   cache_dir=f"{{CACHE}}/c{{i}}")
            results.append(hashlib.sha256(open(path, "rb").read()).hexdigest())
        except Exception as e:
            errors.append(repr(e))
    threads = [threading.Thread(target=one, args=(i,)) for i in range(64)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    report({{"results": results, "errors": errors[:3]}})
"""


def big_sha(upstream: FakeHub) -> str:
    repo = upstream.repos[("kernel", BIG)]
    return hashlib.sha256(repo.commits[repo.branches["v1"]].files[BIG_FILE]).hexdigest()


def test_64_concurrent_cold_downloads_are_one_upstream_body_transfer(upstream, tmp_path):
    upstream.faults.throttle("_weights.bin", 24 << 20)  # about a second: every client arrives while it runs
    with pulled(tmp_path / "home", upstream) as m:
        code = CONCURRENT.replace("{CACHE}", str(tmp_path / "caches"))
        p, out = client(code, m.url, tmp_path / "hf", timeout=300, HF_HUB_DOWNLOAD_TIMEOUT="60")
        assert out is not None, p.stderr[-3000:]
        assert out["errors"] == [] and out["results"] == [big_sha(upstream)] * 64
    assert len(body_transfers(upstream, big_sha(upstream))) == 1


def test_an_upstream_that_cuts_every_transfer_still_gives_the_client_the_right_bytes(upstream, tmp_path):
    """Each upstream answer ends after 5 MiB. The mirror resumes with Range requests (never from byte 0)
    until it gives up; the client, streamed what has come so far, retries while bytes keep coming, and
    each retry resumes the mirror's fetch, so the file arrives whole and right. Nothing is stored
    until it verifies."""
    home = tmp_path / "home"
    upstream.faults.drop_after("_weights.bin", 5 << 20, times=10)  # more than the mirror's retries
    fetch = f"""
        import hashlib
        from huggingface_hub import hf_hub_download
        path = hf_hub_download({BIG!r}, {BIG_FILE!r}, repo_type="kernel", revision="v1")
        report(hashlib.sha256(open(path, "rb").read()).hexdigest())
    """
    with pulled(home, upstream) as m:
        p, out = client(fetch, m.url, tmp_path / "hf1")
        assert out == big_sha(upstream), p.stderr[-2000:]
    transfers = body_transfers(upstream, big_sha(upstream))
    assert len(transfers) >= 5 and all(
        t.status == 206 and t.headers.get("Range", "").startswith("bytes=") for t in transfers[1:]
    ), transfers
    assert run_cli("verify", home=home).returncode == 0


def test_a_big_cold_file_streams_to_the_client_while_the_upstream_is_still_sending_it(upstream, tmp_path):
    """Bytes reach the client as the upstream sends them: a client would otherwise wait, with nothing
    arriving, for the whole upstream transfer (and give up after its 10 s read timeout on a big file).
    The last bytes wait for verification."""

    held = 12 << 20
    upstream.faults.hold("_weights.bin", held)
    with pulled(tmp_path / "home", upstream) as m, contextlib.ExitStack() as done:
        done.callback(upstream.faults.release)  # a failing test must not leave the upstream held
        url = f"/kernels/{BIG}/resolve/v1/{BIG_FILE}"
        headers, body, before = read_held_stream(m.port, url, held, upstream.faults.release)
        assert int(headers["content-length"]) == BIG_SIZE and before < BIG_SIZE, headers
        assert hashlib.sha256(body).hexdigest() == big_sha(upstream)
        assert [ln for ln in m.stderr().splitlines() if BIG_FILE in ln and f'" 200 {BIG_SIZE} ' in ln], m.stderr()
    assert run_cli("verify", home=tmp_path / "home").returncode == 0


def test_a_client_that_goes_away_mid_stream_ends_its_answer_not_the_fetch(upstream, tmp_path):
    import socket

    held = 12 << 20
    upstream.faults.hold("_weights.bin", held)
    home = tmp_path / "home"
    with pulled(home, upstream) as m, contextlib.ExitStack() as done:
        done.callback(upstream.faults.release)
        with socket.create_connection(("127.0.0.1", m.port), timeout=30) as s:
            s.sendall(raw_request("GET", f"/kernels/{BIG}/resolve/v1/{BIG_FILE}"))
            status, _, body = read_response_head(s)
            assert status == 200
        upstream.faults.release()
        deadline = time.monotonic() + 60
        while not [ln for ln in m.stderr().splitlines() if BIG_FILE in ln and '"GET ' in ln]:
            assert time.monotonic() < deadline, m.stderr()
            time.sleep(0.1)
        line = next(ln for ln in m.stderr().splitlines() if BIG_FILE in ln and '"GET ' in ln)
        assert int(line.split('" 200 ')[1].split()[0]) < BIG_SIZE, line  # not read to the end for nobody
        p, out = client(
            f"""
            import hashlib
            from huggingface_hub import hf_hub_download
            report(hashlib.sha256(open(hf_hub_download({BIG!r}, {BIG_FILE!r}, repo_type="kernel", revision="v1"),
                                       "rb").read()).hexdigest())
        """,
            m.url,
            tmp_path / "hf",
        )
        assert out == big_sha(upstream), p.stderr[-2000:]
    assert len(body_transfers(upstream, big_sha(upstream))) == 1  # the fetch went on and was kept


def test_every_replica_streams_a_big_cold_file_whichever_one_fetches_it(upstream, tmp_path):
    """Two serve processes over one home (replicas behind nginx, or --workers): a client of each at
    once; one fetches (the per-blob lock), the other's answer reads the same `.part` as it grows, so
    both get bytes while the upstream is still held, and one body crosses the wire."""
    import socket

    held = 12 << 20
    upstream.faults.hold("_weights.bin", held)
    home = tmp_path / "home"
    with pulled(home, upstream) as a, pulled(home, upstream) as b, contextlib.ExitStack() as done:
        done.callback(upstream.faults.release)
        socks = [done.enter_context(socket.create_connection(("127.0.0.1", m.port), timeout=30)) for m in (a, b)]
        bodies = []
        for s in socks:
            s.sendall(raw_request("GET", f"/kernels/{BIG}/resolve/v1/{BIG_FILE}"))
            status, headers, body = read_response_head(s)
            assert status == 200, headers
            while len(body) < held - (2 << 20):
                chunk = s.recv(1 << 20)
                assert chunk, len(body)
                body += chunk
            bodies.append(body)
        upstream.faults.release()
        for s, body in zip(socks, bodies, strict=False):
            while chunk := s.recv(1 << 20):
                body += chunk
            assert hashlib.sha256(body).hexdigest() == big_sha(upstream)
    assert len(body_transfers(upstream, big_sha(upstream))) == 1


def test_a_slow_upstream_is_streamed_so_the_client_neither_times_out_nor_retries(upstream, tmp_path):
    """hf_hub_download with a 3 s read timeout, a file the upstream takes ~8 s to send: one GET, no retry."""
    upstream.faults.throttle("_weights.bin", 3 << 20)
    fetch = f"""
        import hashlib
        from huggingface_hub import hf_hub_download
        path = hf_hub_download({BIG!r}, {BIG_FILE!r}, repo_type="kernel", revision="v1")
        report(hashlib.sha256(open(path, "rb").read()).hexdigest())
    """
    with pulled(tmp_path / "home", upstream) as m:
        p, out = client(fetch, m.url, tmp_path / "hf", HF_HUB_DOWNLOAD_TIMEOUT="3")
        assert out == big_sha(upstream), p.stderr[-3000:]
        gets = [ln for ln in m.stderr().splitlines() if '"GET ' in ln and BIG_FILE in ln]
        assert len(gets) == 1, gets


def test_bytes_streamed_from_a_pull_that_then_fails_are_never_completed_by_a_resume(upstream, tmp_path):
    """The upstream serves the big file's bytes tampered: the streamed client is cut before the last bytes,
    nothing is stored, the home records it; once the upstream is right again, a resume (a Range request)
    gets the whole file (200), never a tail to append to bytes the mirror could not vouch for."""
    repo = upstream.repos[("kernel", BIG)]
    sha = big_sha(upstream)
    good = repo.commits[repo.branches["v1"]].files[BIG_FILE]
    repo.set_file_bytes("v1", BIG_FILE, good[:-1] + bytes([good[-1] ^ 1]))  # advertised: still the good file
    home = tmp_path / "home"
    with pulled(home, upstream) as m:
        status, headers, body = raw_http(
            m.port, raw_request("GET", f"/kernels/{BIG}/resolve/v1/{BIG_FILE}"), timeout=60
        )
        assert status == 200 and len(body) < BIG_SIZE, (status, len(body))
        assert not any(b.stat().st_size == BIG_SIZE for b in (home / "store").rglob("*") if b.is_file())
        # One line says why the answer was cut; uvicorn's "returned without completing" is not a second.
        assert "answer cut after" in m.stderr() and "without completing" not in m.stderr(), m.stderr()[-2000:]
        repo.set_file_bytes("v1", BIG_FILE, good)
        status, headers, body = raw_http(
            m.port, raw_request("GET", f"/kernels/{BIG}/resolve/v1/{BIG_FILE}", f"Range: bytes={10 << 20}-"), timeout=60
        )
        assert status == 200 and hashlib.sha256(body).hexdigest() == sha, (status, len(body))
        # Stored and verified now; a resume is still answered whole for a file once streamed unverified.
        status, _, body = raw_http(
            m.port, raw_request("GET", f"/kernels/{BIG}/resolve/v1/{BIG_FILE}", f"Range: bytes={10 << 20}-"), timeout=60
        )
        assert status == 200 and len(body) == BIG_SIZE
    p = run_cli("verify", home=home)
    assert p.returncode == 0, p.stdout + p.stderr


def test_with_the_upstream_stopped_everything_pulled_still_loads_flagged_stale(saved_model, tmp_path):
    hub = upstream_hub(saved_model)
    hub.start()
    home = tmp_path / "home"
    try:
        with pulled(home, hub, "--refs-ttl", "0.5", "--upstream-timeout", "5", "--access-log", "-") as m:
            p, first = client(GET_BOTH, m.url, tmp_path / "hf1")
            assert first is not None, p.stderr[-3000:]
            hub.stop()
            time.sleep(0.6)  # past the refs TTL: the next request asks the upstream, which is gone
            p, out = client(GET_BOTH, m.url, tmp_path / "hf2")
            assert out == first, p.stderr[-3000:]
            status, headers, _ = raw_http(m.port, raw_request("GET", f"/api/kernels/{ACTIVATION}/refs"))
            assert status == 200 and "upstream" in headers.get("x-mirror-stale", ""), headers
            assert any(line.endswith(" stale") for line in m.stdout().splitlines())
            # A repo never pulled is not "not found" while nobody can ask: a 503 saying why and when to come back.
            status, headers, _ = raw_http(m.port, raw_request("GET", f"/api/kernels/{ORG}/layernorm/refs"))
            assert status == 503 and "x-error-code" not in headers and headers["retry-after"] == "5", (status, headers)
            assert "upstream cannot be asked" in headers["x-error-message"]
    finally:
        hub.stop()


def test_a_new_upstream_commit_on_v1_is_seen_after_the_ttl(upstream, tmp_path):
    get_v1 = f"""
        import kernels
        k = kernels.get_kernel("{ACTIVATION}", version=1)
        report(k.REVISION_NOTE)
    """
    with pulled(tmp_path / "home", upstream, "--refs-ttl", "1") as m:
        p, out = client(get_v1, m.url, tmp_path / "hf1")
        assert out == "cu-rebuild", p.stderr[-2000:]
        repo = upstream.repos[("kernel", ACTIVATION)]
        repo.commit(build("activation", [X86_CPU], version=1, note="hotfix"), title="Hotfix", branch="v1")
        deadline = time.monotonic() + 30
        while True:  # the TTL is 1 s; a loaded machine may take longer to get there
            p, out = client(get_v1, m.url, tmp_path / f"hf{int(time.monotonic() * 1000)}")
            if out == "hotfix" or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert out == "hotfix", p.stderr[-2000:]


needs_transformers = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None,
    reason="this venv (huggingface_hub 1.33) has no transformers/torch; the main venv runs this load",
)


def test_a_model_is_pulled_file_by_file_and_then_staged_as_pulled(upstream, tmp_path):
    home = tmp_path / "home"
    with pulled(home, upstream) as m:
        p, out = client(
            f"""
            import json
            from huggingface_hub import hf_hub_download, snapshot_download
            cfg = json.load(open(hf_hub_download({TINY_MODEL!r}, "config.json")))
            snap = snapshot_download({TINY_MODEL!r}, allow_patterns=["*.json", "*.safetensors"])
            import os
            report({{"type": cfg["model_type"], "files": sorted(os.listdir(snap))}})
        """,
            m.url,
            tmp_path / "hf",
        )
        assert out is not None and out["type"] == "qwen2", p.stderr[-3000:]
        assert "README.md" not in out["files"] and "config.json" in out["files"]
    assert run_cli("verify", home=home).returncode == 0
    # Served again with the upstream unreachable: only what was pulled is there.
    upstream.stop()
    with serving(home, env=serve_env()) as m:
        p, out = client(
            f"""
            from huggingface_hub import hf_hub_download
            report(open(hf_hub_download({TINY_MODEL!r}, "config.json")).read()[:1])
        """,
            m.url,
            tmp_path / "hf2",
        )
        assert out == "{", p.stderr[-2000:]


def test_a_dataset_is_pulled_as_a_model_is(upstream, tmp_path):
    home = tmp_path / "home"
    code = f"""
        from huggingface_hub import hf_hub_download, snapshot_download
        train = open(hf_hub_download({DATASET!r}, "data/train.csv", repo_type="dataset"), "rb").read()
        snap = snapshot_download({DATASET!r}, repo_type="dataset", allow_patterns=["data/*"])
        import os
        report({{"train": len(train), "files": sorted(os.listdir(os.path.join(snap, "data")))}})
    """
    with pulled(home, upstream) as m:
        p, out = client(code, m.url, tmp_path / "hf")
        assert out == {"train": len(TRAIN), "files": ["test.csv", "train.csv"]}, p.stderr[-3000:]
    assert run_cli("verify", home=home).returncode == 0
    upstream.stop()  # served from the home alone now, by a serve without an upstream: as a dataset
    with serving(home, env=serve_env()) as m:
        p, out = client(code, m.url, tmp_path / "hf2")
        assert out == {"train": len(TRAIN), "files": ["test.csv", "train.csv"]}, p.stderr[-3000:]
    # An ordinary staged set: bundled and imported elsewhere, exported as an offline Hub cache.
    assert run_cli("bundle", str(tmp_path / "b.tar"), home=home).returncode == 0
    other = tmp_path / "other"
    p = run_cli("import", str(tmp_path / "b.tar"), home=other)
    assert p.returncode == 0, p.stderr
    with serving(other, env=serve_env()) as m:
        p, out = client(code, m.url, tmp_path / "hf3")
        assert out == {"train": len(TRAIN), "files": ["test.csv", "train.csv"]}, p.stderr[-3000:]
    p = run_cli("export-cache", str(tmp_path / "cache"), "--target", X86, home=other)
    assert p.returncode == 0, p.stderr
    p = load_offline(
        f"""
        from huggingface_hub import hf_hub_download
        path = hf_hub_download({DATASET!r}, "data/train.csv", repo_type="dataset")
        assert len(open(path, "rb").read()) == {len(TRAIN)}
    """,
        {"HF_HUB_CACHE": str(tmp_path / "cache")},
    )
    assert p.returncode == 0, p.stderr[-3000:]


@needs_transformers
def test_transformers_from_pretrained_through_pull_through(upstream, tmp_path):
    from tests.support.model_fixtures import LOAD

    with pulled(tmp_path / "home", upstream) as m:
        p, out = client(LOAD.format(repo=TINY_MODEL), m.url, tmp_path / "hf", timeout=300)
        assert out is not None and out["type"] == "qwen2", p.stderr[-3000:]
    assert run_cli("verify", home=tmp_path / "home").returncode == 0
