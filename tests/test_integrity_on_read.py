"""Integrity on read (issue 27, item 1): a byte flipped in a stored blob after it was verified (bit rot,
a bad disk, an operator's edit) never reaches a client as a complete file. serve sends only a file it
verified lately and that is still that file (a cache that a changed byte cannot fool: ctime moves even
when mtime is put back), or hashes what it sends and holds back the last chunk; a Range and nginx's
X-Accel-Redirect hand-off verify the whole blob first; export-cache hashes what it links.

One home is staged once from the fake Hub (kept running: `stage` and pull-through fetch again); each
test corrupts its own copy (`cp -a`, so the views stay hard links to the store)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.cli import X86, run_cli
from tests.support.fakehub import FakeHub
from tests.support.kernel_fixtures import ACTIVATION, ORG, demo_repos
from tests.support.nginx import front_of
from tests.support.serve_helpers import raw_http, raw_request, run_client, serving
from tests.support.serve_home import BIG, BIG_FILE, BIG_SIZE, SO, big_repo, manifest

AT = 12_345_678  # the flipped byte of the big file: in its 3rd 4 MiB chunk, well before the last


@pytest.fixture(scope="module")
def upstream():
    with FakeHub([*demo_repos(), big_repo()], trusted_orgs=[ORG], page_size=5) as hub:
        yield hub


@pytest.fixture(scope="module")
def pristine(upstream, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("integrity")
    m = manifest(tmp / "m.toml", {ACTIVATION: {"version": 1}, BIG: {"version": 1}})
    p = run_cli("--endpoint", upstream.url, "stage", str(m), "--json", home=tmp / "home")
    assert p.returncode == 0, p.stderr
    return tmp / "home"


@pytest.fixture
def home(pristine, tmp_path) -> Path:
    subprocess.run(["cp", "-a", str(pristine), str(tmp_path / "home")], check=True)  # keeps hard links
    return tmp_path / "home"


def original(upstream, repo: str, path: str) -> bytes:
    r = upstream.repos[("kernel", repo)]
    return r.commits[r.branches["v1"]].files[path]


def url_of(upstream, repo: str, path: str) -> str:
    return f"/kernels/{repo}/resolve/{upstream.repos[('kernel', repo)].branches['v1']}/{path}"


def blob(home: Path, data: bytes) -> Path:
    sha = hashlib.sha256(data).hexdigest()
    return home / "store" / "sha256" / sha[:2] / sha


def flip(path: Path, at: int, keep_mtime: bool = True) -> None:
    """Flip one bit of the byte at `at`, in place (as `dd conv=notrunc` would); put mtime back as an
    operator covering it could (`touch -r`): size and mtime are then as verified, only ctime moved."""
    before = os.stat(path)
    with open(path, "r+b") as f:  # the blob is 0444: the tests run as root, or chmod first
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x01]))
    if keep_mtime:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        after = os.stat(path)
        assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)
        assert after.st_ctime_ns != before.st_ctime_ns  # no user can put ctime back


def get(port: int, path: str, *headers: str, method: str = "GET"):
    return raw_http(port, raw_request(method, path, *headers), timeout=30)


DOWNLOAD = """
    import hashlib, os
    from huggingface_hub import hf_hub_download
    try:
        path = hf_hub_download({repo!r}, {path!r}, repo_type="kernel", revision="v1")
    except Exception as e:
        report({{"error": type(e).__name__, "message": str(e)[:400]}})
    else:
        report({{"sha256": hashlib.sha256(open(path, "rb").read()).hexdigest()}})
"""


def download(url: str, hf_home: Path, repo: str, path: str) -> dict:
    p, out = run_client(DOWNLOAD.format(repo=repo, path=path), url, hf_home)
    assert out is not None, p.stderr[-3000:]
    return out


def complete_files(hf_home: Path) -> list[bytes]:
    """Every file the client's cache holds as complete (not `.incomplete`)."""
    return [p.read_bytes() for p in (hf_home / "hub").rglob("blobs/*") if not p.name.endswith(".incomplete")]


def quarantine_events(home: Path, timeout: float = 10) -> list[dict]:
    """The `quarantine` events (written by serve from a thread of its own: waited for)."""
    from frt.mirror.events import QUARANTINE, events_of
    from frt.mirror.store.home import Home

    deadline = time.monotonic() + timeout
    while True:
        h = Home(home)
        try:
            events = [e.__dict__ for e in events_of(h.ledger, QUARANTINE)]
        finally:
            h.close()
        if events or time.monotonic() > deadline:
            return events
        time.sleep(0.1)


# -- the happy path ---------------------------------------------------------------------------------


def concurrent_gets(port: int, path: str, n: int = 8) -> list[tuple[int, int, bytes]]:
    """n raw GETs at once (each one's first: one hashes it, the others wait for its word at the end)."""
    with ThreadPoolExecutor(n) as pool:
        return [
            (status, int(headers.get("content-length", -1)), body)
            for status, headers, body in pool.map(lambda _: get(port, path), range(n))
        ]


def test_untouched_blobs_are_served_byte_identical_whole_ranged_and_again(upstream, home, tmp_path):
    big, so = original(upstream, BIG, BIG_FILE), original(upstream, ACTIVATION, SO)
    with serving(home) as m:
        assert all(r == (200, BIG_SIZE, big) for r in concurrent_gets(m.port, url_of(upstream, BIG, BIG_FILE)))
        for _ in range(2):  # the second time through the verified cache and MirrorApp.hot
            got = download(m.url, tmp_path / f"hf{_}", BIG, BIG_FILE)
            assert got == {"sha256": hashlib.sha256(big).hexdigest()}
            assert get(m.port, url_of(upstream, ACTIVATION, SO))[2] == so
            status, headers, body = get(m.port, url_of(upstream, BIG, BIG_FILE), "Range: bytes=10485760-")
            assert (status, body) == (206, big[10 << 20 :])
        err = m.stderr()
    assert "cut" not in err and "quarantined" not in err
    assert not (home / "quarantine").exists()


# -- serve alone ------------------------------------------------------------------------------------


def test_a_flipped_byte_is_never_a_complete_file_to_the_client(upstream, home, tmp_path):
    """Unmodified hf_hub_download through serve: an error, and no complete file in its cache."""
    big = original(upstream, BIG, BIG_FILE)
    flip(blob(home, big), AT)
    with serving(home) as m:
        out = download(m.url, tmp_path / "hf", BIG, BIG_FILE)
        assert "error" in out, out
        assert complete_files(tmp_path / "hf") == []
        again = download(m.url, tmp_path / "hf2", BIG, BIG_FILE)  # quarantined now: its HEAD is a 500 too
        assert "error" in again and complete_files(tmp_path / "hf2") == [], again
        err = m.stderr()
    assert re.search(r"blob [0-9a-f]{64} failed verification on read, quarantined", err), err
    assert "ASGI callable returned without completing response" not in err  # the cut's own line says it


def test_a_raw_get_is_cut_short_then_every_request_for_it_is_a_500(upstream, home):
    big = original(upstream, BIG, BIG_FILE)
    bad = blob(home, big)
    flip(bad, AT)
    url = url_of(upstream, BIG, BIG_FILE)
    with serving(home) as m:
        status, headers, body = get(m.port, url)
        assert status == 200 and int(headers["content-length"]) == BIG_SIZE
        # The last chunk held back: the cut is at the end, past the bad byte (a prefix the client never
        # gets to complete: the next request is refused, a resume included).
        assert AT < len(body) < BIG_SIZE and body[AT] == big[AT] ^ 1
        for method in ("GET", "HEAD"):
            status, headers, _ = get(m.port, url, method=method)
            assert status == 500 and "quarantined" in headers["x-error-message"], (method, status, headers)
        ranged = get(m.port, url, "Range: bytes=0-99")
        assert ranged[0] == 500
        metrics = get(m.port, "/metrics")[2].decode()
        assert re.search(r"^frt_mirror_quarantined_blobs_total 1\.0$", metrics, re.M), metrics
        events = quarantine_events(home)
        page = get(m.port, "/")[2].decode()
    sha = bad.name
    assert [e["ref"] for e in events] == [sha] and BIG_FILE in events[0]["detail"]
    assert "Last quarantine" in page and sha[:16] in page
    moved = list((home / "quarantine").iterdir())
    assert [p.name.split(".")[0] for p in moved] == [sha] and not bad.exists()
    v = run_cli("verify", home=home)
    assert v.returncode == 1 and re.search(rf"missing blob {sha} .*serve quarantined it", v.stdout), v.stdout


def test_concurrent_first_gets_of_a_changed_blob_all_end_short(upstream, home):
    """The first GETs of a blob arrive together: one hashes it as it sends, the others send it unhashed
    and wait for its word before their last chunk; none completes the changed file."""
    big = original(upstream, BIG, BIG_FILE)
    flip(blob(home, big), AT)
    with serving(home) as m:
        answers = concurrent_gets(m.port, url_of(upstream, BIG, BIG_FILE))
    assert all(
        status == 500 or (status == 200 and len(body) < length == BIG_SIZE) for status, length, body in answers
    ), [(s, n, len(b)) for s, n, b in answers]
    assert any(status == 200 for status, _, _ in answers)  # at least the one that hashed it was under way


def test_a_small_file_is_checked_before_its_status_line(upstream, home):
    """A file of one chunk (the .so) is read and hashed before anything is sent: a clean 500."""
    so = original(upstream, ACTIVATION, SO)
    flip(blob(home, so), len(so) // 2)
    with serving(home) as m:
        status, headers, _ = get(m.port, url_of(upstream, ACTIVATION, SO))
    assert status == 500 and "failed verification" in headers["x-error-message"]


def test_mtime_put_back_does_not_fool_the_verified_cache(upstream, home):
    """A whole GET (hashed as sent: from then on the file's key is in the verified-file cache, and GETs
    and Ranges of it are sent unhashed); the byte flipped and mtime put back with os.utime (size, inode
    and mtime as verified; ctime moved): the next whole GET is hashed again and cut, never completed."""
    big = original(upstream, BIG, BIG_FILE)
    url = url_of(upstream, BIG, BIG_FILE)
    with serving(home) as m:
        assert get(m.port, url)[2] == big
        assert get(m.port, url)[2] == big  # from the cache
        assert get(m.port, url, f"Range: bytes={AT}-{AT}")[2] == big[AT : AT + 1]
        flip(blob(home, big), AT)
        status, headers, body = get(m.port, url)
        assert status == 200 and len(body) < int(headers["content-length"]) == BIG_SIZE
        assert get(m.port, url, f"Range: bytes={AT}-{AT}")[0] == 500


def test_a_range_after_the_flip_is_verified_whole_first(upstream, home):
    """The cache holds the file's key (a whole GET); the byte flipped, mtime put back; the first request
    after is a Range: the whole blob is hashed before a byte of it goes, and it is a 500."""
    big = original(upstream, BIG, BIG_FILE)
    url = url_of(upstream, BIG, BIG_FILE)
    with serving(home) as m:
        assert get(m.port, url)[2] == big
        flip(blob(home, big), AT)
        status, _, body = get(m.port, url, f"Range: bytes={AT}-{AT}")
        assert status == 500 and body != bytes([big[AT] ^ 1])


def served_file(app, upstream, repo: str, path: str):
    return app.catalog().repo("kernel", repo).commits[upstream.repos[("kernel", repo)].branches["v1"]].files[path]


@pytest.mark.parametrize("ranged", [False, True])
def test_the_cache_is_trusted_for_the_ttl_only(upstream, home, ranged):
    """Bit rot changes no metadata, so the cache can hold the key of a changed file. An entry older than
    FRT_SERVE_VERIFY_TTL (here 0) is not trusted: a whole GET hashes what it sends (cut), a Range
    hashes the whole blob first (500)."""
    from frt.mirror.serve.run import make_app
    from frt.mirror.store.home import Home

    big = original(upstream, BIG, BIG_FILE)
    flip(blob(home, big), AT)
    app = make_app(Home(home))
    app.integrity.ttl = 0.0
    f = served_file(app, upstream, BIG, BIG_FILE)
    app.integrity.vouch(f, os.stat(f.blob))  # the cache's word for the file as it is now
    headers = [(b"range", b"bytes=0-9")] if ranged else []
    status, body, complete = asyncio.run(asgi_get(app, url_of(upstream, BIG, BIG_FILE), *headers))
    if ranged:
        assert status == 500
    else:
        assert status == 200 and not complete and len(body) < BIG_SIZE
    assert f.sha256 in app.integrity.bad


async def asgi_get(app, path: str, *headers: tuple[bytes, bytes]) -> tuple[int, bytes, bool]:
    """One GET through the ASGI app in process: (status, body, whether the body was completed)."""
    sent, status, complete = [], None, False
    messages = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive():
        if messages:
            return messages.pop()
        await asyncio.sleep(3600)

    async def send(message):
        nonlocal status, complete
        if message["type"] == "http.response.start":
            status = message["status"]
        else:
            sent.append(message.get("body", b""))
            complete = complete or not message.get("more_body", False)

    scope = {
        "type": "http",
        "method": "GET",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(b"host", b"x"), *headers],
        "root_path": "",
    }
    await app(scope, receive, send)
    return status, b"".join(sent), complete


# -- nginx in front (serve --accel-redirect) ------------------------------------------------------------


def test_through_nginx_the_hand_off_is_verified_first(upstream, home, tmp_path):
    """nginx sends the body (X-Accel-Redirect), so serve cannot hash it as it goes: each replica verifies
    the whole blob before it hands off, through its cache. Both replicas verify and cache the file; the
    byte is flipped with mtime put back; then no GET through nginx gets the changed file, and the real
    client gets an error."""
    big = original(upstream, BIG, BIG_FILE)
    url = url_of(upstream, BIG, BIG_FILE)
    with front_of(home, tmp_path / "nginx") as front:
        for _ in range(4):  # round robin: each replica hands it off at least once (cached from then on)
            status, headers, body = get(front.port, url)
            assert status == 200 and body == big and "x-accel-redirect" not in headers
        flip(blob(home, big), AT)
        for _ in range(4):  # the first replica asked finds it bad and moves it out; the other finds it gone
            status, headers, body = get(front.port, url)
            assert status == 500 and len(body) < 1000, (status, len(body), headers)
        out = download(front.url, tmp_path / "hf", BIG, BIG_FILE)
        assert "error" in out and complete_files(tmp_path / "hf") == [], out
        assert get(front.port, url, "Range: bytes=0-99")[0] >= 400
    assert not blob(home, big).exists() and len(list((home / "quarantine").iterdir())) == 1


# -- export-cache, stage again, pull-through ----------------------------------------------------------------


def test_export_cache_refuses_a_changed_blob_and_writes_nothing(upstream, home, tmp_path):
    so = original(upstream, ACTIVATION, SO)
    flip(blob(home, so), 100)
    p = run_cli("export-cache", str(tmp_path / "cache"), "--target", X86, home=home)
    assert p.returncode == 1, p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and SO in lines[0] and blob(home, so).name in lines[0] and "Traceback" not in p.stderr
    assert not (tmp_path / "cache").exists()


def test_export_cache_replaces_an_older_copy_it_did_not_hash(upstream, home, tmp_path):
    """A cache exported before holds its own copy of a blob (here: a different file): a new export links the
    store's verified file in its place instead of keeping the old one unseen."""
    so = original(upstream, ACTIVATION, SO)
    assert run_cli("export-cache", str(tmp_path / "cache"), "--target", X86, home=home).returncode == 0
    [old] = [p for p in (tmp_path / "cache").rglob("blobs/*") if p.read_bytes() == so]
    old.unlink()
    old.write_bytes(so[:-1] + bytes([so[-1] ^ 1]))  # another file under that name: bad bytes
    assert run_cli("export-cache", str(tmp_path / "cache"), "--target", X86, home=home).returncode == 0
    assert old.read_bytes() == so and os.path.samefile(old, blob(home, so))


def test_stage_again_fetches_a_quarantined_blob_and_serve_takes_it_back(upstream, home, tmp_path):
    big = original(upstream, BIG, BIG_FILE)
    flip(blob(home, big), AT)
    url = url_of(upstream, BIG, BIG_FILE)
    m_path = tmp_path / "m.toml"
    manifest(m_path, {ACTIVATION: {"version": 1}, BIG: {"version": 1}})
    with serving(home) as m:
        assert len(get(m.port, url)[2]) < BIG_SIZE
        assert get(m.port, url)[0] == 500
        quarantine_events(home)
        p = run_cli("--endpoint", upstream.url, "stage", str(m_path), home=home)
        assert p.returncode == 0, p.stderr
        assert get(m.port, url)[2] == big  # the new file is judged afresh (and hashed as it is sent)
    v = run_cli("verify", home=home)
    assert v.returncode == 0, v.stdout


def test_pull_through_fetches_a_quarantined_blob_again(upstream, tmp_path):
    home = tmp_path / "home"
    big = original(upstream, BIG, BIG_FILE)
    url = url_of(upstream, BIG, BIG_FILE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FRT_", "HF_"))} | {"PYTHONWARNINGS": "ignore"}
    with serving(home, "--upstream", upstream.url, "--allow", ORG, "--upstream-timeout", "30", env=env) as m:
        assert get(m.port, url)[2] == big  # pulled, stored
        flip(blob(home, big), AT)
        assert len(get(m.port, url)[2]) < BIG_SIZE  # found bad as it was sent: cut, moved out
        assert get(m.port, url)[2] == big  # fetched again from the upstream, verified, sent
        assert get(m.port, url, "Range: bytes=0-99")[2] == big[:100]
    v = run_cli("verify", home=home)
    assert v.returncode == 0, v.stdout  # the view too was linked to the new file
