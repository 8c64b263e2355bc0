"""fetch_file hashes a download as it is written: a finished file is not read back to be verified
(store.RunningDigest), also when it was resumed or restarted. In-process, against the fake Hub with
the real Hub's redirects: the read-back (digest_file) is watched to prove it is not taken."""

from __future__ import annotations

import hashlib

import pytest

from frt.mirror.stage import fetch as fetch_module
from frt.mirror.stage.fetch import IntegrityError, fetch_file
from frt.mirror.stage.transport import Transport
from frt.mirror.store.files import FileBlobStore
from frt.resolver.hub import HubClient
from tests.support.fakehub import FakeHub, FakeRepo
from tests.support.kernel_fixtures import ORG, variant_files

pytestmark = pytest.mark.hub1

REPO = f"{ORG}/digest"
PATH = "build/torch-universal/_weights.bin"
SIZE = 3 << 20
DATA = hashlib.shake_128(b"running digest").digest(SIZE)


@pytest.fixture
def hub():
    repo = FakeRepo(REPO)
    repo.commit(
        variant_files("digest", "torch-universal", version=1, extra={"_weights.bin": DATA}), title="w", branch="v1"
    )
    with FakeHub([repo], redirects=True, trusted_orgs=[ORG]) as h:
        yield h


@pytest.fixture
def read_backs(monkeypatch):
    calls = []
    real = fetch_module.digest_file

    def watched(path):
        calls.append(path)
        return real(path)

    monkeypatch.setattr(fetch_module, "digest_file", watched)
    return calls


def fetch(hub, tmp_path, monkeypatch):
    monkeypatch.setenv("FRT_RETRY_BASE_WAIT", "0.01")
    client = HubClient(hub.url)
    commit = client.revision_sha(REPO, "v1")
    entry = next(f for f in client.repo_listing(REPO, commit, "kernel") if f.path == PATH)
    store = FileBlobStore(tmp_path / "home")
    return store, lambda: fetch_file(Transport(client), store, REPO, commit, entry)


def test_a_download_is_verified_as_it_is_written_not_read_back(hub, tmp_path, monkeypatch, read_backs):
    store, run = fetch(hub, tmp_path, monkeypatch)
    got = run()
    assert got.digest.sha256 == hashlib.sha256(DATA).hexdigest() and got.downloaded == SIZE
    assert store.path(got.digest.sha256).read_bytes() == DATA
    assert read_backs == []


def test_a_resumed_download_is_hashed_once_across_its_pieces(hub, tmp_path, monkeypatch, read_backs):
    hub.faults.drop_after("_weights.bin", 1 << 20, times=2)  # three pieces, the last two by Range
    store, run = fetch(hub, tmp_path, monkeypatch)
    got = run()
    assert store.path(got.digest.sha256).read_bytes() == DATA and read_backs == []
    ranges = [e.headers.get("Range") for e in hub.request_log if e.server == "cdn" and e.method == "GET"]
    assert ranges[0] is None and all(r and r.startswith("bytes=") for r in ranges[1:]), ranges


def test_a_stale_part_from_an_earlier_run_is_resumed_then_dropped_and_fetched_clean(
    hub, tmp_path, monkeypatch, read_backs
):
    store, run = fetch(hub, tmp_path, monkeypatch)
    part = store.scratch.part_path(hashlib.sha256(DATA).hexdigest())
    part.write_bytes(b"\0" * (1 << 20))  # a prefix that is not the file's: resumed from, caught, dropped
    got = run()
    assert store.path(got.digest.sha256).read_bytes() == DATA and not part.exists()


def test_tampered_bytes_are_refused_and_not_stored(hub, tmp_path, monkeypatch, read_backs):
    repo = hub.repos[("kernel", REPO)]
    repo.set_file_bytes("v1", PATH, DATA[:-1] + bytes([DATA[-1] ^ 1]))
    store, run = fetch(hub, tmp_path, monkeypatch)
    with pytest.raises(IntegrityError, match="upstream advertised sha256"):
        run()
    assert not store.has(hashlib.sha256(DATA).hexdigest())
    assert not [p for p in store.scratch.tmp.iterdir() if p.name.endswith(".part")]


def test_a_resume_the_upstream_answers_whole_starts_the_part_over(hub, tmp_path, monkeypatch, read_backs):
    """A CDN that ignores Range (fake Hub `ignore_range`): the resumed request gets a 200 with the whole
    file, which is written as a new `.part` from byte 0 (never appended, never truncated in place)."""
    hub.faults.drop_after("_weights.bin", 1 << 20, times=1)
    hub.faults.ignore_range("_weights.bin")
    store, run = fetch(hub, tmp_path, monkeypatch)
    got = run()
    assert store.path(got.digest.sha256).read_bytes() == DATA and read_backs == []
    gets = [e for e in hub.request_log if e.server == "cdn" and e.method == "GET"]
    assert [e.status for e in gets] == [200, 200] and gets[1].headers.get("Range"), gets
