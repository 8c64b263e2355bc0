"""The blob store on an S3-compatible object store (`--store s3://BUCKET/PREFIX`), against a real S3 server
(SeaweedFS's weed: tests/support/s3server.py) and a real PostgreSQL ledger: stagers on separate "hosts"
(homes that share no folder) store each blob once, as an object named by its sha256; verify streams and
re-hashes every object and catches a flipped byte; what cannot work is one line and the right exit code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.big_kernel import BIG
from tests.support.cli import X86, cli_env, one_line, run_cli, stage_to, start_cli, write_manifest
from tests.support.kernel_fixtures import ACTIVATION, RELU
from tests.support.stage_race import stage_gc_race, two_stagers, wait_for


def s3_env(s3_server, **extra: str) -> dict[str, str]:
    return cli_env(**{**s3_server.env(), **extra})


def objects(s3_server, url: str) -> dict[str, int]:
    """The store's objects as the S3 server lists them: sha256 -> size."""
    return {str(o["path"]).rsplit("/", 1)[-1]: int(o["size"]) for o in s3_server.store(url).list("sha256").collect()}


@pytest.fixture
def manifest(tmp_path) -> Path:
    return write_manifest(tmp_path / "m.toml", {RELU: {"version": 1}, ACTIVATION: {"version": 2}}, [X86])


def test_two_stagers_on_two_hosts_store_each_blob_once(big_hub, tmp_path, big_manifest, pg_url, s3_server, s3_store):
    """Two homes that share no folder (two hosts), one PostgreSQL ledger, one bucket; the second stager
    starts while the first is mid-download. The ledger server's lock per blob lets one fetch it and upload
    it; the other waits and finds the object: every body crosses from the upstream once (so is uploaded
    once: only a downloader uploads), the bucket holds each distinct blob once, no home has a view."""
    big_hub.faults.throttle("/resolve/", 0.4e6)  # each big body takes seconds: the second stager meets them
    env = s3_env(s3_server)
    homes = [tmp_path / "host-a", tmp_path / "host-b"]
    cmd = ["--ledger", pg_url, "--store", s3_store, "--endpoint", big_hub.url]

    for repo in (BIG, RELU):  # both start from one scanned ledger (a scan reads metadata.json, each its own)
        assert run_cli(*cmd, "scan", repo, home=homes[0], env=env).returncode == 0
    big_hub.reset_log()

    docs = two_stagers(big_hub, lambda i: start_cli(*cmd, "stage", str(big_manifest), "--json", home=homes[i], env=env))
    stored = objects(s3_server, s3_store)
    assert sum(stored.values()) == docs[0]["needed_bytes"], "each distinct blob once, whole"
    for home in homes:
        assert not (home / "views").exists() and not list((home / "store").rglob("*/*")), "blobs live in S3 only"
        assert not list((home / "tmp").glob("*.part")), "no part left behind"
    v = run_cli(*cmd, "verify", "--json", home=homes[1], env=env)
    assert v.returncode == 0, v.stdout + v.stderr
    report = json.loads(v.stdout)
    assert report["blobs"] == len(stored) and report["view_files"] == 0 and report["problems"] == []


def test_verify_streams_every_object_and_names_a_flipped_byte(hub, tmp_path, manifest, pg_url, s3_server, s3_store):
    """A byte flipped in one object (a bad disk behind the S3 server, or a hand with write access) is found
    by verify, which streams and re-hashes every object: exit 1, the blob named; the others pass."""
    env, home = s3_env(s3_server), tmp_path / "home"
    cmd = ["--ledger", pg_url, "--store", s3_store]
    p = stage_to(s3_store, pg_url, hub.url, manifest, home=home, env=env, json=True)
    assert p.returncode == 0, p.stderr
    stored = objects(s3_server, s3_store)
    victim = max(stored, key=stored.get)  # the biggest: a .so
    raw = s3_server.store(s3_store)
    key = f"sha256/{victim[:2]}/{victim}"
    data = bytearray(raw.get(key).bytes())
    data[len(data) // 2] ^= 0x01
    raw.put(key, bytes(data))  # unconditional: what a damaged backend or a careless admin does
    v = run_cli(*cmd, "verify", home=home, env=env)
    assert v.returncode == 1, v.stdout + v.stderr
    bad = [line for line in (v.stdout + v.stderr).splitlines() if victim in line]
    assert bad and "corrupt blob" in bad[0], v.stdout + v.stderr
    assert sum("corrupt blob" in line for line in (v.stdout + v.stderr).splitlines()) == 1


def test_an_object_once_written_is_never_replaced(tmp_path, pg_url, s3_server, s3_store, monkeypatch):
    """Two uploads of one key: the first stays (a conditional PUT, If-None-Match: *), whatever the second
    carries; and the server refuses bytes whose sha256 is not the one the PUT names."""
    from frt.mirror.store.blobs import digest_file
    from frt.mirror.store.s3 import S3BlobStore

    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    store = S3BlobStore(s3_store, tmp_path / "home")
    good, other = tmp_path / "good.part", tmp_path / "other.part"
    good.write_bytes(b"the verified bytes\n" * 1000)
    other.write_bytes(b"something else\n" * 1000)
    d = digest_file(good)
    store.commit(good, d)
    assert not good.exists() and store.has(d.sha256) and store.uploaded == 1
    store.commit(other, d)  # a buggy or hostile second writer under the same name
    assert store.digest(d.sha256) == d and store.uploaded == 1


UPLOAD_RSS = """
import hashlib, resource, sys
from pathlib import Path
from frt.mirror.store.blobs import Digest
from frt.mirror.store.s3 import S3BlobStore

store, part, size = S3BlobStore(sys.argv[1], Path(sys.argv[2])), Path(sys.argv[3]), int(sys.argv[4])
h = hashlib.sha256()
with open(part, "wb") as f:
    for i in range(size >> 20):
        chunk = hashlib.shake_128(b"%d" % i).digest(1 << 20)
        h.update(chunk)
        f.write(chunk)
store.has("0" * 64)  # the client, its runtime and its connection made before the high-water mark is read
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
store.commit(part, Digest(h.hexdigest(), "", size))
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before, store.uploaded, store.digest(h.hexdigest()).size)
"""


def test_a_big_blob_is_uploaded_in_parts_not_held_in_memory_whole(tmp_path, s3_server, s3_store):
    """A blob far bigger than a part goes up in parts read from its file as they go: the uploader's memory
    grows by a few parts, not by the blob (one PUT of a 4 GiB model shard was 4 GiB of RSS, per stage job)."""
    import subprocess
    import sys

    size = 96 << 20
    p = subprocess.run(
        [sys.executable, "-c", UPLOAD_RSS, s3_store, str(tmp_path / "home"), str(tmp_path / "big.part"), str(size)],
        capture_output=True,
        text=True,
        env=s3_env(s3_server),
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    grew_kib, uploaded, stored = (int(x) for x in p.stdout.split())
    assert (uploaded, stored) == (1, size)
    assert grew_kib < (size >> 10) // 3, f"RSS grew {grew_kib >> 10} MiB uploading a {size >> 20} MiB blob"


@pytest.mark.parametrize("ledger", ["the home's", "sqlite:///", "sqlite+pysqlite:///"])
def test_a_sqlite_ledger_beside_an_s3_store_is_refused_in_one_line(
    hub, tmp_path, manifest, s3_server, s3_store, ledger
):
    """The home's SQLite file, or one named by --ledger (tried by hand: that one was taken, and a second host
    would have staged into the same bucket with a ledger of its own)."""
    named = () if ledger == "the home's" else ("--ledger", f"{ledger}{tmp_path / 'l.sqlite'}")
    p = run_cli(
        *named,
        *("--store", s3_store, "--endpoint", hub.url, "stage", str(manifest)),
        home=tmp_path / "h",
        env=s3_env(s3_server),
    )
    assert p.returncode == 2, p.stderr
    assert "database server" in one_line(p)
    assert not objects(s3_server, s3_store)


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"AWS_SECRET_ACCESS_KEY": "not-the-secret"}, "SignatureDoesNotMatch"),
        ({"AWS_ACCESS_KEY_ID": "nobody"}, "InvalidAccessKeyId"),
    ],
)
def test_a_store_that_refuses_says_its_reason_in_one_line(tmp_path, pg_url, s3_server, s3_store, change, said):
    """The S3 server's own error code, which obstore's first line leaves in the XML body after it (tried by
    hand: the line ended at `<?xml version="1.0" encoding="UTF-8"?>`); nginx-conf asks the store first too."""
    env = s3_env(s3_server, FRT_LEDGER_URL=pg_url, FRT_STORE_URL=s3_store, **change)
    for args in (("verify",), ("nginx-conf", "--run-dir", str(tmp_path / "run"))):
        p = run_cli(*args, home=tmp_path / "h", env=env)
        assert p.returncode == 3 and said in one_line(p), (args, p.stderr)
        assert not p.stdout, args


@pytest.mark.parametrize("url", ["gs://bucket/x", "s3://", "s3://b/../x", "bucket/prefix"])
def test_a_store_url_that_is_not_s3_is_bad_input(tmp_path, url):
    p = run_cli("--store", url, "verify", home=tmp_path / "h")
    assert p.returncode == 2
    assert "s3://BUCKET/PREFIX" in one_line(p)


def test_an_unreachable_store_is_exit_3_in_one_line(hub, tmp_path, manifest, pg_url, s3_server, s3_store):
    """The object store down (here: nothing listens where AWS_ENDPOINT_URL points): the same command may
    work later, so exit 3, as for a dead upstream or ledger server; one line naming the store."""
    env = s3_env(s3_server, AWS_ENDPOINT_URL="http://127.0.0.1:9")
    p = stage_to(s3_store, pg_url, hub.url, manifest, home=tmp_path / "h", env=env)
    assert p.returncode == 3, p.stderr
    assert s3_store in one_line(p)


def test_a_bundle_from_the_bucket_imports_into_a_filesystem_home_and_back(
    hub, tmp_path, manifest, pg_server, s3_server, s3_store
):
    """bundle on an S3 home streams each object into the tar (hashed as it goes); import into a plain
    home (SQLite, files, views) verifies it and everything works there; that home's bundle imported into
    a second bucket prefix (another ledger) lands there as objects, and verify holds on both."""
    env = s3_env(s3_server)
    first, second = pg_server.new_database(), pg_server.new_database()
    s3_home, fs_home, back_home = tmp_path / "s3-home", tmp_path / "fs-home", tmp_path / "back-home"
    on_s3 = ["--ledger", first, "--store", s3_store]
    p = run_cli(*on_s3, "--endpoint", hub.url, "stage", str(manifest), home=s3_home, env=env)
    assert p.returncode == 0, p.stderr
    out = tmp_path / "from-s3.tar"
    b = run_cli(*on_s3, "bundle", str(out), home=s3_home, env=env)
    assert b.returncode == 0, b.stderr
    i = run_cli("import", str(out), home=fs_home, env=env)
    assert i.returncode == 0, i.stderr
    v = run_cli("verify", "--json", home=fs_home, env=env)
    assert v.returncode == 0 and json.loads(v.stdout)["view_files"] > 0, v.stdout
    e = run_cli("env", "--target", "torch2.13-cpu-x86_64-linux", home=fs_home, env=env)
    assert e.returncode == 0 and "LOCAL_KERNELS=" in e.stdout, e.stderr

    back = tmp_path / "from-fs.tar"
    assert run_cli("bundle", str(back), home=fs_home, env=env).returncode == 0
    prefix = s3_server.new_prefix()
    on_back = ["--ledger", second, "--store", prefix]
    i = run_cli(*on_back, "import", str(back), home=back_home, env=env)
    assert i.returncode == 0, i.stderr
    assert objects(s3_server, prefix) == objects(s3_server, s3_store)
    assert not (back_home / "views").exists()
    v = run_cli(*on_back, "verify", "--json", home=back_home, env=env)
    assert v.returncode == 0 and json.loads(v.stdout)["problems"] == [], v.stdout


def test_gc_on_another_host_waits_for_a_stager_and_takes_only_the_unreferenced_objects(
    hub, tmp_path, pg_url, s3_server, s3_store
):
    """activation v1 staged into the bucket and unstaged: its objects are garbage. Host B stages v2 and is
    held mid-body, its small files already uploaded but not yet recorded as staged; gc on host A (its own
    home: no file lock in common) waits on the ledger server's store lock, then removes v1's objects and
    nothing of v2's; verify holds after."""
    import hashlib

    env = s3_env(s3_server)
    common = ["--ledger", pg_url, "--store", s3_store]
    host_a, host_b = tmp_path / "host-a", tmp_path / "host-b"

    def variant(branch: str) -> set[str]:
        r = hub.repos[("kernel", ACTIVATION)]
        files = r.commits[r.branches[branch]].files
        return {
            hashlib.sha256(d).hexdigest()
            for p, d in files.items()
            if d is not None and p.startswith("build/torch213-cxx11-cpu-x86_64-linux/")
        }

    old, new = variant("v1"), variant("v2")
    assert old and new and not old & new
    m1 = write_manifest(tmp_path / "v1.toml", {ACTIVATION: {"version": 1}}, [X86])
    assert run_cli(*common, "--endpoint", hub.url, "stage", str(m1), home=host_a, env=env).returncode == 0
    assert run_cli(*common, "unstage", f"{ACTIVATION}@v1", home=host_a, env=env).returncode == 0
    assert old <= set(objects(s3_server, s3_store))

    hub.faults.hold("_activation.abi3.so", 4096)
    m2 = write_manifest(tmp_path / "v2.toml", {ACTIVATION: {"version": 2}}, [X86])
    with stage_gc_race(hub, tmp_path, env) as race:
        race.stage("--home", str(host_b), *common, "--endpoint", hub.url, "stage", str(m2), "--json")
        wait_for("the stage to upload its small files", lambda: set(objects(s3_server, s3_store)) & new)
        race.gc("--home", str(host_a), *common, "gc", "--json")
        race.finish()
    done = race.gc_json()
    assert {b["sha256"] for b in done["blobs"]} == old - new
    left = set(objects(s3_server, s3_store))
    assert new <= left and not (old - new) & left
    v = run_cli(*common, "verify", "--json", home=host_b, env=env)
    assert v.returncode == 0 and json.loads(v.stdout)["problems"] == [], v.stdout


def test_env_into_writes_the_targets_files_verified_and_kernels_loads_them_offline(
    hub, tmp_path, manifest, pg_url, s3_server, s3_store
):
    """On an object store, env --target T --into DIR writes each chosen variant's files (streamed and
    hashed) where LOCAL_KERNELS then points; kernels loads them with no network at all. A second run writes
    nothing; without --into it is one line; a damaged object is refused and leaves no folder behind."""
    from tests.support.offline import load_offline

    env, home, into = s3_env(s3_server), tmp_path / "home", tmp_path / "node"
    common = ["--ledger", pg_url, "--store", s3_store]
    assert run_cli(*common, "--endpoint", hub.url, "stage", str(manifest), home=home, env=env).returncode == 0
    target = "torch2.13-cpu-x86_64-linux"
    p = run_cli(*common, "env", "--target", target, "--into", str(into), "--format", "json", home=home, env=env)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    paths = [Path(k["path"]) for k in doc["kernels"]]
    assert paths and all(str(path).startswith(str(into)) and path.is_dir() for path in paths)
    loaded = load_offline(
        f"import kernels; print(kernels.get_kernel({RELU!r}, version=1).__name__ != '')",
        {"LOCAL_KERNELS": doc["env"]["LOCAL_KERNELS"]},
    )
    assert loaded.returncode == 0 and loaded.stdout.strip() == "True", loaded.stderr
    mtimes = {p: p.stat().st_mtime_ns for p in into.rglob("*") if p.is_file()}
    assert run_cli(*common, "env", "--target", target, "--into", str(into), home=home, env=env).returncode == 0
    assert {p: p.stat().st_mtime_ns for p in into.rglob("*") if p.is_file()} == mtimes  # nothing rewritten

    no_into = run_cli(*common, "env", "--target", target, home=home, env=env)
    assert no_into.returncode == 2 and "--into DIR" in one_line(no_into)

    raw = s3_server.store(s3_store)
    stored = objects(s3_server, s3_store)
    victim = max(stored, key=stored.get)
    key = f"sha256/{victim[:2]}/{victim}"
    data = bytearray(raw.get(key).bytes())
    data[0] ^= 0x01
    raw.put(key, bytes(data))
    fresh = tmp_path / "node2"
    bad = run_cli(*common, "env", "--target", target, "--into", str(fresh), home=home, env=env)
    assert bad.returncode == 1 and victim in one_line(bad)
    assert not [p for p in fresh.rglob("*") if p.is_file()], "nothing half-written is visible"


def test_export_cache_from_the_bucket_works_offline(hub, tmp_path, manifest, pg_url, s3_server, s3_store):
    """export-cache on an object store: each blob fetched (and verified) beside the cache, hard-linked in;
    kernels loads from that cache with HF_HUB_OFFLINE=1 and no network at all; no scratch is left."""
    from tests.support.offline import load_offline

    env, home, cache = s3_env(s3_server), tmp_path / "home", tmp_path / "hf-cache"
    common = ["--ledger", pg_url, "--store", s3_store]
    assert stage_to(s3_store, pg_url, hub.url, manifest, home=home, env=env).returncode == 0
    p = run_cli(*common, "export-cache", str(cache), "--target", "torch2.13-cpu-x86_64-linux", home=home, env=env)
    assert p.returncode == 0, p.stderr
    assert not list(cache.glob(".frt-export-*")), "the fetched blobs' scratch is gone"
    loaded = load_offline(
        f"import kernels; print(kernels.get_kernel({RELU!r}, version=1).__name__ != '')",
        {"HF_HUB_CACHE": str(cache)},
    )
    assert loaded.returncode == 0 and loaded.stdout.strip() == "True", loaded.stderr
