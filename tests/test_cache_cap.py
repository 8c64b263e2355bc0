"""serve --upstream … --cache-max SIZE: pulled blobs evicted least recently used first to hold the cap, staged
ones never, nor one being read. 64 unmodified huggingface_hub clients over more distinct files than fit,
through two serve workers; the store sampled all along; verify clean after."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import sqlite3
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.cli import run_cli
from tests.support.fakehub import FakeHub, FakeRepo
from tests.support.kernel_fixtures import ORG, variant_files
from tests.support.serve_helpers import run_client, serve_env, serving
from tests.support.serve_home import manifest, stage

pytestmark = pytest.mark.hub1

REPOS, SHARDS, SHARD = 8, 3, 384 << 10  # 8 variants of about 1.1 MiB: 9 MiB to pull, 3 MiB of cache
CAP = 3 << 20
STAGED = f"{ORG}/cache0"  # staged beforehand: asked for too, never evicted


def cache_repo(k: int) -> FakeRepo:
    repo = FakeRepo(f"{ORG}/cache{k}")
    shards = {f"_shard{j}.bin": hashlib.shake_128(b"cache %d %d" % (k, j)).digest(SHARD) for j in range(SHARDS)}
    repo.commit(
        variant_files(f"cache{k}", "torch-universal", version=1, note="c", extra=shards), title="build", branch="v1"
    )
    return repo


def wanted(hub: FakeHub) -> dict[str, dict[str, str]]:
    """Every shard a client asks for: repo -> path -> sha256."""
    out: dict[str, dict[str, str]] = {}
    for k in range(REPOS):
        repo = hub.repos[("kernel", f"{ORG}/cache{k}")]
        files = repo.commits[repo.branches["v1"]].files
        out[repo.repo_id] = {
            p: hashlib.sha256(b).hexdigest() for p, b in files.items() if p.endswith(".bin") and b is not None
        }
    return out


CLIENTS = """
    import hashlib, random, threading
    from huggingface_hub import hf_hub_download
    want = {WANT}
    files = sorted((r, p) for r in want for p in want[r])
    ok, errors, wrong = [0], [], []
    def one(i):
        rnd = random.Random(i)
        for n in range(6):
            repo, path = rnd.choice(files)
            try:
                got = hf_hub_download(repo, path, repo_type="kernel", revision="v1",
                                      cache_dir=f"{CACHE}/c{i}", force_download=True)
                if hashlib.sha256(open(got, "rb").read()).hexdigest() != want[repo][path]:
                    wrong.append(path)
                else:
                    ok[0] += 1
            except Exception as e:
                errors.append(repr(e)[:300])
    threads = [threading.Thread(target=one, args=(i,)) for i in range(64)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    report({"ok": ok[0], "errors": errors[:3], "failed": len(errors), "wrong": len(wrong)})
"""


def blobs(home: Path) -> dict[str, int]:
    """The store's blobs on disk: sha256 -> size."""
    out = {}
    for p in (home / "store" / "sha256").glob("??/*"):
        try:
            out[p.name] = p.stat().st_size
        except FileNotFoundError:
            continue
    return out


def test_cache_max_holds_under_64_clients_and_verify_is_clean_after(tmp_path):
    home = tmp_path / "home"
    with FakeHub([cache_repo(k) for k in range(REPOS)], trusted_orgs=[ORG], redirects=True) as hub:
        stage(home, [manifest(tmp_path / "m.toml", {STAGED: {"version": 1}})], hub.url)
        staged = blobs(home)
        assert len(staged) >= SHARDS
        want = wanted(hub)
        assert sum(s for r in want.values() for s in [SHARD] * len(r)) > 2 * CAP  # more than fit

        peak, samples, stop = [0], [0], threading.Event()

        def sample() -> None:
            lock = home / "locks" / "cache.lock"
            while not stop.is_set():
                # Under the cache's lock, shared (evictions take it exclusive): a listing of the store's
                # folders one after another is then not a blob evicted seen beside the one it made room for.
                fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH)
                    now = blobs(home)
                finally:
                    os.close(fd)
                peak[0] = max(peak[0], sum(size for sha, size in now.items() if sha not in staged))
                assert all(sha in now for sha in staged), "a staged blob was evicted"
                samples[0] += 1
                time.sleep(0.02)

        args = ("--upstream", hub.url, "--allow", ORG, "--upstream-timeout", "30", "--cache-max", "3MiB")
        with serving(home, *args, "--workers", "2", env=serve_env()) as m:
            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            code = CLIENTS.replace("{WANT}", json.dumps(want)).replace("{CACHE}", str(tmp_path / "caches"))
            p, out = run_client(code, m.url, tmp_path / "hf", timeout=600, HF_HUB_ETAG_TIMEOUT="60")
            stop.set()
            sampler.join()
            (tmp_path / "serve.err").write_text(m.stderr())
            assert out is not None, p.stderr[-3000:]
            assert out == {"ok": 64 * 6, "errors": [], "failed": 0, "wrong": 0}, out
            metrics = urllib.request.urlopen(f"{m.url}/metrics", timeout=30).read().decode()
            err = m.stderr()
        assert "Traceback" not in err, err[-3000:]
    evicted = [line for line in metrics.splitlines() if line.startswith("frt_mirror_evicted_blobs_total")]
    assert evicted and float(evicted[0].split()[-1]) > 0, metrics
    assert samples[0] > 10 and 0 < peak[0] <= CAP, (peak, samples)
    end = blobs(home)
    assert all(sha in end for sha in staged)
    assert sum(size for sha, size in end.items() if sha not in staged) <= CAP
    v = run_cli("verify", "--json", home=home)
    assert v.returncode == 0 and json.loads(v.stdout)["ok"], v.stdout[-3000:] + v.stderr
    with sqlite3.connect(home / "ledger.sqlite") as db:
        events = db.execute("SELECT files, nbytes FROM mirror_events WHERE kind = 'evict'").fetchall()
        pulled = db.execute("SELECT count(*) FROM staged WHERE target LIKE 'pulled:%'").fetchone()[0]
        stage_rows = db.execute("SELECT count(*) FROM staged WHERE target NOT LIKE 'pulled:%'").fetchone()[0]
    assert events and sum(n for n, _ in events) > 0 and stage_rows >= 1
    assert pulled <= REPOS - 1  # what was evicted is no longer staged (at most what fits is)


def test_a_blob_being_read_is_not_evicted_and_goes_once_closed(tmp_path):
    """The store's side: an open answer's lease (a shared flock) keeps its blob; closed, eviction takes it,
    records it, and the home verifies clean."""
    from frt.mirror.serve.cache_cap import CacheKeeper
    from frt.mirror.store.blobs import Digest
    from frt.mirror.store.evict import cached, evict, mark_pulled
    from frt.mirror.store.home import Home
    from frt.mirror.store.records import record_blobs

    home = Home(tmp_path / "home")
    store = home.store
    data = os.urandom(1 << 20)
    part = store.scratch.part_path("x")
    part.write_bytes(data)
    d = Digest(hashlib.sha256(data).hexdigest(), "0" * 40, len(data))
    store.commit(part, d)
    record_blobs(home.ledger, [d])
    mark_pulled(home.ledger, d.sha256)
    assert [c.sha256 for c in cached(home)] == [d.sha256]

    path = store.files.path(d.sha256)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert CacheKeeper.lease(fd)
        out = evict(home, cached(home))
        assert out.blobs == [] and out.busy == 1 and path.is_file()
        assert os.pread(fd, 16, 0) == data[:16]
    finally:
        os.close(fd)
    out = evict(home, cached(home))
    assert [c.sha256 for c in out.blobs] == [d.sha256] and not path.exists()
    assert cached(home) == []
    v = run_cli("verify", "--json", home=home.root)
    assert v.returncode == 0 and json.loads(v.stdout)["ok"], v.stdout
    with sqlite3.connect(home.root / "ledger.sqlite") as db:
        assert db.execute("SELECT files, nbytes FROM mirror_events WHERE kind = 'evict'").fetchall() == [(1, 1 << 20)]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--cache-max", "3MiB"], "--cache-max only means something with --upstream URL"),
        (
            ["--upstream", "http://127.0.0.1:9", "--allow", ORG, "--cache-max", "lots"],
            "--cache-max 'lots': expected a size",
        ),
        (
            ["--upstream", "http://127.0.0.1:9", "--allow", ORG, "--min-free", "-1G"],
            "--min-free '-1G': expected a size",
        ),
    ],
)
def test_cache_options_refused_in_one_line(tmp_path, args, says):
    p = run_cli("serve", *args, home=tmp_path / "home")
    assert p.returncode == 2 and says in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_sizes():
    from frt.mirror.serve.cache_cap import parse_size

    assert parse_size("10GiB", "--cache-max") == 10 << 30
    assert parse_size("500M", "--cache-max") == 500_000_000
    assert parse_size("1.5k", "--cache-max") == 1500
    assert parse_size("4096", "--cache-max") == 4096
    assert parse_size("2 MiB", "--cache-max") == 2 << 20


def test_kernels_parser_loaded_by_many_threads_at_once(tmp_path):
    """serve's fetch threads parse their first metadata.json at once: kernels' PyO3 parser is loaded
    once, never initialised twice (an ImportError, a 500, before)."""
    import subprocess
    import sys

    code = (
        "import threading\nfrom frt.resolver.kernel_metadata import kernels_rust\n"
        "errs = []\nb = threading.Barrier(16)\n"
        "def one():\n    b.wait()\n    try:\n        kernels_rust()\n"
        "    except Exception as e:\n        errs.append(repr(e))\n"
        "ts = [threading.Thread(target=one) for _ in range(16)]\n[t.start() for t in ts]\n[t.join() for t in ts]\n"
        "print(len(errs))\n"
    )
    for _ in range(3):
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0 and p.stdout.strip() == "0", p.stdout + p.stderr


def test_a_fetched_blob_is_pinned_until_its_answers_have_opened_it(tmp_path):
    """The fetch's pin (pin.py) keeps a blob just stored from eviction, however full the cache: shares of
    it (each waiting answer's) keep it after the flight's own pin is closed; the last one closed, it goes."""
    from frt.mirror.serve.cache_cap import CacheBounds, CacheKeeper
    from frt.mirror.store.blobs import Digest
    from frt.mirror.store.evict import cached, evict
    from frt.mirror.store.home import Home
    from frt.mirror.store.records import record_blobs

    home = Home(tmp_path / "home")
    data = os.urandom(1 << 16)
    part = home.store.scratch.part_path("x")
    part.write_bytes(data)
    d = Digest(hashlib.sha256(data).hexdigest(), "0" * 40, len(data))
    home.store.commit(part, d)
    record_blobs(home.ledger, [d])
    keeper = CacheKeeper(home, CacheBounds(max_bytes=1))
    pin = keeper.stored(d.sha256)  # what the fetch's on_stored does: pinned, then marked pulled
    assert pin is not None and [c.sha256 for c in cached(home)] == [d.sha256]
    answers = [pin.share(), pin.share()]
    pin.close()
    for share in answers:
        out = evict(home, cached(home))
        assert out.blobs == [] and out.busy == 1 and home.store.files.path(d.sha256).is_file()
        assert share is not None
        share.close()
    assert [c.sha256 for c in evict(home, cached(home)).blobs] == [d.sha256]


def test_an_evicted_answer_redirects_to_itself_once_then_never_again():
    """A 307 loop is impossible: the redirect is marked, and a marked request is never redirected (503)."""
    from frt.mirror.serve.blob import again
    from frt.mirror.serve.pin import marked

    scope = {"path": "/kernels/o/r/resolve/v1/a.bin", "raw_path": b"/kernels/o/r/resolve/v1/a.bin", "query_string": b""}
    first = again(scope)
    assert first.status == 307 and first.headers["Location"] == "/kernels/o/r/resolve/v1/a.bin?frt-evicted=1"
    follow = {**scope, "query_string": b"frt-evicted=1"}
    assert marked(follow) and not marked(scope)
    second = again(follow)
    assert second.status == 503 and second.headers["Retry-After"] == "1"


BIG = 3 << 20  # one file larger than the cap below (kept under pull.STREAM_MIN: verified before it is sent)


def test_a_file_larger_than_the_cap_is_passed_through_unkept(tmp_path):
    """serve --cache-max 1MiB and a 3 MiB file: huggingface_hub gets it whole and right, the store never
    keeps it, and verify is clean after."""
    home = tmp_path / "home"
    repo = FakeRepo(f"{ORG}/big")
    body = hashlib.shake_128(b"big").digest(BIG)
    repo.commit(
        variant_files("big", "torch-universal", version=1, note="b", extra={"_big.bin": body}),
        title="build",
        branch="v1",
    )
    want = {repo.repo_id: {"build/torch-universal/_big.bin": hashlib.sha256(body).hexdigest()}}
    code = (
        "import hashlib\nfrom huggingface_hub import hf_hub_download\nwant = {WANT}\nout = []\n"
        "for n in range(3):\n"
        "    for r in want:\n        for p in want[r]:\n"
        "            got = hf_hub_download(r, p, repo_type='kernel', revision='v1', cache_dir=f'{CACHE}/{n}')\n"
        "            out.append(hashlib.sha256(open(got, 'rb').read()).hexdigest() == want[r][p])\n"
        "report(out)\n"
    )
    code = code.replace("{WANT}", json.dumps(want)).replace("{CACHE}", str(tmp_path / "caches"))
    with FakeHub([repo], trusted_orgs=[ORG], redirects=True) as hub:
        args = ("--upstream", hub.url, "--allow", ORG, "--cache-max", "1MiB")
        with serving(home, *args, env=serve_env()) as m:
            p, out = run_client(code, m.url, tmp_path / "hf", timeout=300)
            err = m.stderr()
        assert out == [True, True, True], p.stderr[-3000:]
        assert "Traceback" not in err, err[-3000:]
    assert want[repo.repo_id]["build/torch-universal/_big.bin"] not in blobs(home)
    assert sum(blobs(home).values()) <= 1 << 20
    v = run_cli("verify", "--json", home=home)
    assert v.returncode == 0 and json.loads(v.stdout)["ok"], v.stdout[-3000:] + v.stderr


@pytest.mark.parametrize("option", ["--cache-max", "--min-free"])
def test_cache_options_refused_over_an_object_store_before_connecting(tmp_path, option):
    """--store s3://…: the blobs are not files here. Refused in one line, exit 2, before anything is
    asked of the ledger's server or the bucket (neither listens: port 9), and no home is made."""
    store = ("--ledger", "postgresql+psycopg://u:p@127.0.0.1:9/x", "--store", "s3://bucket/prefix")
    serve = ("serve", "--upstream", "http://127.0.0.1:9", "--allow", ORG, option, "1GiB")
    t0 = time.monotonic()
    p = run_cli(*store, *serve, home=tmp_path / "home")
    said = "--store s3://bucket/prefix: " + option + " needs the blobs as files on this host"
    assert p.returncode == 2 and said in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert time.monotonic() - t0 < 30 and not (tmp_path / "home").exists()
