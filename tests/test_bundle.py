"""bundle / import across an air gap, as an operator runs them.

Home A stages from the fake Hub and writes a bundle; home B imports it inside `unshare -n`
(no route anywhere), then the real `kernels` loads from B's views with no network. A damaged
or hostile bundle is refused with exit 1 and leaves B byte-for-byte as it was.
"""

from __future__ import annotations

import json
import re
import sqlite3
import tarfile
from pathlib import Path

import pytest

from tests.support.bundles import edit_manifest, import_offline, rewrite, snapshot
from tests.support.cli import ARM_CU, X86, run_cli
from tests.support.homes import empty_home
from tests.support.kernel_fixtures import ACTIVATION, LAYERNORM, RELU, X86_CPU
from tests.support.offline import NO_NET, load_offline


def test_bundle_imports_offline_and_everything_works_there(home_a, tmp_path):
    out, doc = home_a.full, home_a.full_doc
    names = tarfile.open(out).getnames()
    assert names[0] == "frt-bundle.json" and len(names) == doc["blobs"] + 1
    assert all(re.fullmatch(r"blobs/[0-9a-f]{64}", n) for n in names[1:])
    assert not list(out.parent.glob(".all.tar.*"))  # the temp file was renamed, not left behind

    b = tmp_path / "b"
    p = import_offline(b, out, "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["new_blobs"] == doc["blobs"]
    assert run_cli("verify", home=b, wrap=NO_NET).returncode == 0

    # activation v1 and v2 are staged (layernorm needs v2): LOCAL_KERNELS holds the one chosen
    p = run_cli("env", "--target", X86, "--version", f"{ACTIVATION}=2", "--format", "json", home=b, wrap=NO_NET)
    assert p.returncode == 0, p.stderr
    env = json.loads(p.stdout)["env"]
    assert str(b) in env["LOCAL_KERNELS"]
    out_k = load_offline(
        f"""
        import kernels
        ln = kernels.get_kernel({LAYERNORM!r}, version=1)
        act = kernels.get_kernel({ACTIVATION!r}, version=2)
        print(ln.VARIANT, act.VARIANT, act.add(2, 3))
    """,
        env,
    )
    assert out_k.returncode == 0, out_k.stderr
    assert out_k.stdout.split() == [X86_CPU, X86_CPU, "5"]

    # B's ledger answers as A's does: resolve --offline, matrix, export-cache.
    for repo, ver in ((ACTIVATION, "2"), (LAYERNORM, "1"), (RELU, "1")):
        args = ("resolve", repo, "--version", ver, "--target", X86, "--offline", "--json")
        there, here = run_cli(*args, home=b, wrap=NO_NET), run_cli(*args, home=home_a.home)
        assert there.returncode == 0, there.stderr
        assert json.loads(there.stdout) == json.loads(here.stdout)
    m_b = run_cli("matrix", ACTIVATION, "--json", home=b, wrap=NO_NET)
    m_a = run_cli("matrix", ACTIVATION, "--json", home=home_a.home)
    assert m_b.returncode == 0 and json.loads(m_b.stdout) == json.loads(m_a.stdout)
    p = run_cli("export-cache", str(tmp_path / "cache"), "--target", X86, home=b, wrap=NO_NET)
    assert p.returncode == 0, p.stderr

    # Importing the same bundle again is a no-op success.
    before = snapshot(b)
    p = import_offline(b, out, "--json")
    assert p.returncode == 0, p.stderr
    assert (json.loads(p.stdout)["new_blobs"], json.loads(p.stdout)["new_rows"]) == (0, 0)
    assert snapshot(b) == before


def test_target_subset_carries_only_that_target(home_a, tmp_path):
    full, sub = home_a.full_doc, home_a.x86_doc
    assert {r["target"] for r in sub["staged"]} == {X86}
    assert {r["target"] for r in full["staged"]} == {X86, ARM_CU}
    assert 0 < sub["blobs"] < full["blobs"]
    b = tmp_path / "b"
    p = import_offline(b, home_a.x86)
    assert p.returncode == 0, p.stderr
    assert run_cli("verify", home=b).returncode == 0
    assert run_cli("env", "--target", X86, "--version", f"{ACTIVATION}=2", home=b).returncode == 0
    p = run_cli("env", "--target", ARM_CU, home=b)
    assert p.returncode == 2 and "nothing is staged" in p.stderr
    # The rest arrives later, on top: B then holds the full set.
    p = import_offline(b, home_a.full, "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["new_blobs"] == full["blobs"] - sub["blobs"]
    assert run_cli("env", "--target", ARM_CU, home=b).returncode == 0
    assert run_cli("verify", home=b).returncode == 0


def test_flipped_blob_is_refused_and_nothing_is_imported(home_a, b_with_x86, tmp_path):
    good, bad = home_a.full, tmp_path / "bad.tar"
    victim = max(doc_blobs(good), key=lambda b: b["size"])  # the last-listed largest: imported after others

    def flip(m, data):
        if m.name == f"blobs/{victim['sha256']}":
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        return [(m, data)]

    rewrite(good, bad, flip)
    before = snapshot(b_with_x86)
    p = import_offline(b_with_x86, bad)
    assert p.returncode == 1
    line = p.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert victim["sha256"] in line and "expected sha256" in line and "hashes to" in line
    actual = re.search(r"hashes to ([0-9a-f]{64})", line)[1]
    assert actual != victim["sha256"]
    assert snapshot(b_with_x86) == before  # no blob, no .part, no view, no ledger row
    assert run_cli("verify", home=b_with_x86).returncode == 0


def doc_blobs(bundle: Path) -> list[dict]:
    with tarfile.open(bundle) as tf:
        return json.load(tf.extractfile("frt-bundle.json"))["blobs"]


def _extra(name: str, kind=tarfile.REGTYPE, linkname: str = ""):
    def edit(m, data):
        out = [(m, data)]
        if m.name == "frt-bundle.json":
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.size = kind, linkname, 0 if kind != tarfile.REGTYPE else 4
            out.append((info, b"evil" if kind == tarfile.REGTYPE else None))
        return out

    return edit


def _drop_first_blob():
    dropped = []

    def edit(m, data):
        if m.name.startswith("blobs/") and not dropped:
            dropped.append(m.name)
            return []
        return [(m, data)]

    return edit


def _bad_json(m, data):
    if m.name == "frt-bundle.json":
        data = data[: len(data) // 2]
        m.size = len(data)
    return [(m, data)]


def _climbing_path(doc):
    """A manifest whose listing puts a staged file outside its variant dir (a view would follow it)."""
    row = doc["staged"][0]
    repo = next(r for r in doc["repos"] if r["repo"] == row["repo"])
    commit = next(c for c in repo["commits"] if c["sha"] == row["commit"])
    variant = next(v for v in commit["variants"] if v["name"] == row["variant"])
    variant["files"][0]["path"] = f"build/{row['variant']}/../../../../evil"


def _forged_listing(doc):
    """A head's history that names a commit the bundle does not carry."""
    listings = doc["repos"][0]["listings"]
    listings[next(iter(listings))].append("f" * 40)


@pytest.mark.parametrize(
    "edit, says",
    [
        (_extra("../evil"), "'../evil'"),
        (_extra("/tmp/frt-evil-abs"), "frt-evil-abs"),
        (_extra("blobs/" + "0" * 64, tarfile.SYMTYPE, "/etc/passwd"), "0" * 64),
        (_extra("blobs/" + "ab" * 32), "is not in frt-bundle.json"),
        (_drop_first_blob(), "missing from the archive"),
        (_bad_json, "malformed frt-bundle.json"),
        (edit_manifest(_climbing_path), "../../../../evil"),
        (edit_manifest(_forged_listing), "a listing names an unknown commit"),
    ],
    ids=["traversal", "absolute", "symlink", "unlisted", "missing", "bad-json", "climbing-path", "forged-listing"],
)
def test_hostile_or_broken_bundles_are_refused(home_a, b_with_x86, tmp_path, edit, says):
    good, bad = home_a.full, tmp_path / "bad.tar"
    rewrite(good, bad, edit)
    before = snapshot(b_with_x86)
    p = import_offline(b_with_x86, bad)
    assert p.returncode == 1, p.stderr
    assert says in p.stderr and "nothing was imported" in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert snapshot(b_with_x86) == before
    assert not (tmp_path / "evil").exists() and not Path("/tmp/frt-evil-abs").exists()


def sparse_member(tmp: Path, real_size: int) -> tuple[bytes, dict]:
    """A tar (GNU tar --sparse, PAX 1.0 sparse headers) of one `blobs/<sha256>` member: `real_size`
    bytes that are all hole but their last 10, in about 10 KiB; and the manifest's entry for it."""
    import hashlib
    import subprocess

    content = bytes(real_size - 10) + b"0123456789"
    sha = hashlib.sha256(content).hexdigest()
    (tmp / "sparse" / "blobs").mkdir(parents=True)
    with open(tmp / "sparse" / "blobs" / sha, "wb") as f:
        f.truncate(real_size - 10)
        f.seek(real_size - 10)
        f.write(content[-10:])
    out = tmp / "sparse.tar"
    subprocess.run(
        ["tar", "--sparse", "--format=pax", "-cf", str(out), "-C", str(tmp / "sparse"), f"blobs/{sha}"], check=True
    )
    with tarfile.open(out) as tf:
        assert tf.getmembers()[0].issparse()
    oid = hashlib.sha1(b"blob %d\0" % real_size + content).hexdigest()  # git's, as a true listing has it
    return out.read_bytes(), {"sha256": sha, "git_oid": oid, "size": real_size}


def with_member(src: Path, dst: Path, tar: bytes, blob: dict) -> None:
    """`src` with `blob` added to its manifest's list and `tar`'s member appended (two archives
    concatenate once the first one's end-of-archive blocks are cut)."""

    rewrite(src, dst, edit_manifest(lambda doc: doc["blobs"].append(blob)))
    with tarfile.open(dst) as tf:
        last = tf.getmembers()[-1]
    end = last.offset_data + -(-last.size // 512) * 512
    dst.write_bytes(dst.read_bytes()[:end] + tar)


def _refused_and_nothing_written(b: Path, bundle: Path, says: str) -> None:
    before = snapshot(b)
    p = import_offline(b, bundle)
    assert p.returncode == 1, (p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert says in lines[0] and "nothing was imported" in lines[0], lines[0]
    assert snapshot(b) == before  # no blob, no .part in tmp/, no view, no ledger row


def test_a_sparse_member_is_refused_before_a_byte_is_written(home_a, b_with_x86, tmp_path):
    """The report's case: a small member standing for a huge file (here 64 MiB from 10 KiB; the report
    had 2 GiB). Its listed size, sha256 and git oid all match what it expands to: only its sparse
    headers give it away. Before: imported, 64 MiB written."""
    tar, blob = sparse_member(tmp_path, 64 << 20)
    with_member(home_a.full, tmp_path / "sparse.tar.bundle", tar, blob)
    assert (tmp_path / "sparse.tar.bundle").stat().st_size < blob["size"] // 16
    _refused_and_nothing_written(b_with_x86, tmp_path / "sparse.tar.bundle", "is a sparse member")


def test_a_member_whose_size_is_not_the_listed_one_is_refused_before_writing(home_a, b_with_x86, tmp_path):
    grown = []

    def grow(m, data):
        if m.name.startswith("blobs/") and not grown:
            grown.append(m.name)
            data += bytes(4096)
            m.size = len(data)
        return [(m, data)]

    rewrite(home_a.full, tmp_path / "grown.tar", grow)
    _refused_and_nothing_written(b_with_x86, tmp_path / "grown.tar", "bytes in the archive, listed as")


@pytest.mark.parametrize("keep", [0.5, "boundary", "no-trailer"])
def test_truncated_bundle_is_a_clean_refusal(home_a, tmp_path, keep):
    good = home_a.full
    data = good.read_bytes()
    with tarfile.open(good) as tf:
        members = tf.getmembers()
        end = members[-1].offset_data + -(-members[-1].size // 512) * 512
    cut = {0.5: len(data) // 2, "boundary": members[-1].offset, "no-trailer": end}[keep]
    bad = tmp_path / "cut.tar"
    bad.write_bytes(data[:cut])
    b = tmp_path / "b"
    p = import_offline(b, bad)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert not b.exists()  # the import made the home, and took it away with the refusal


def test_bundle_of_nothing_is_bad_input(home, tmp_path):
    p = run_cli("bundle", str(tmp_path / "x.tar"), home=empty_home(home))
    assert p.returncode == 2 and "nothing is staged" in p.stderr
    assert not (tmp_path / "x.tar").exists()


def test_a_format_1_bundle_still_imports_with_its_history(tmp_path):
    """A bundle written by the previous release (format 1: parent links, no listings; made at
    7bde11a from relu v1 for x86 CPU) imports with no network, verifies, resolves, and each ref's
    head gets the history its parent links recorded."""
    old = Path(__file__).parent / "data" / "v4" / "relu-v1.tar"
    b = tmp_path / "b"
    p = import_offline(b, old)
    assert p.returncode == 0, p.stderr
    assert run_cli("verify", home=b, wrap=NO_NET).returncode == 0
    p = run_cli("resolve", RELU, "--version", "1", "--target", X86, "--offline", "--json", home=b, wrap=NO_NET)
    assert p.returncode == 0, p.stderr
    commit = json.loads(p.stdout)["commit"]
    with tarfile.open(old) as tf:
        doc = json.load(tf.extractfile("frt-bundle.json"))
    parents = {c["sha"]: c["parent"] for c in doc["repos"][0]["commits"]}
    with sqlite3.connect(b / "ledger.sqlite") as db:
        listed = [sha for (sha,) in db.execute("SELECT sha FROM listings WHERE head = ? ORDER BY position", (commit,))]
    assert listed == [commit, parents[commit]] and parents[parents[commit]] is None


@pytest.mark.parametrize("size", [0, 1, 64 << 10, (4 << 20) - 1, 4 << 20, (9 << 20) + 7])
def test_a_member_is_written_and_hashed_exactly_across_chunk_edges(tmp_path, size):
    """import's copier (bundle/extract.py) reads a member with pread into its thread's reused 4 MiB
    buffer: at every edge of a chunk, the bytes written and both hashes are the member's own, as
    digest_file has them."""
    import hashlib
    import os

    from frt.mirror.bundle.extract import copy_member
    from frt.mirror.store.blobs import digest_file

    data = hashlib.shake_256(str(size).encode()).digest(size) if size else b""
    src, out = tmp_path / "archive", tmp_path / "out"
    src.write_bytes(b"h" * 512 + data + b"t" * 1024)
    (tmp_path / "alone").write_bytes(data)
    fd, o = os.open(src, os.O_RDONLY), os.open(out, os.O_RDWR | os.O_CREAT)
    try:
        got = copy_member(fd, 512, size, o)
    finally:
        os.close(fd)
        os.close(o)
    assert out.read_bytes() == data
    assert got == digest_file(tmp_path / "alone")


@pytest.mark.parametrize("refusal", ["EXDEV", "EOPNOTSUPP", "ENOSPC"])
def test_a_member_is_copied_where_the_kernel_copy_refuses(tmp_path, monkeypatch, refusal):
    """copy_file_range(2) refuses some pairs of files (across filesystems on an older kernel, some
    network filesystems): the member is read and written through the buffer instead, the same bytes and
    digest. A full home is no such refusal: the home's LocalDiskError, naming the part."""
    import errno
    import os

    from frt.mirror.bundle import extract
    from frt.mirror.store.blobs import digest_file
    from frt.resolver.errors import LocalDiskError

    def refuse(*args, **kwargs):
        raise OSError(getattr(errno, refusal), os.strerror(getattr(errno, refusal)))

    monkeypatch.setattr(extract.os, "copy_file_range", refuse)
    data = os.urandom((4 << 20) + 3)
    src, out = tmp_path / "archive", tmp_path / "out"
    src.write_bytes(b"h" * 512 + data)
    (tmp_path / "alone").write_bytes(data)
    fd, o = os.open(src, os.O_RDONLY), os.open(out, os.O_RDWR | os.O_CREAT)
    try:
        if refusal == "ENOSPC":
            with pytest.raises(LocalDiskError, match="out"):
                extract.copy_member(fd, 512, len(data), o, written=out)
            return
        got = extract.copy_member(fd, 512, len(data), o)
    finally:
        os.close(fd)
        os.close(o)
    assert out.read_bytes() == data
    assert got == digest_file(tmp_path / "alone")


@pytest.mark.parametrize("written", [False, True])
def test_an_archive_that_ends_inside_a_member_is_refused(tmp_path, written):
    """The archive shrank under the import (its headers were read whole): a clean refusal, not a short blob,
    whether the member is only hashed (the store has it) or copied in the kernel into a part."""
    import os

    from frt.mirror.bundle.extract import copy_member
    from frt.mirror.bundle.format import BundleRejected

    src = tmp_path / "archive"
    src.write_bytes(b"x" * 5000)
    fd = os.open(src, os.O_RDONLY)
    out = os.open(tmp_path / "part", os.O_RDWR | os.O_CREAT) if written else None
    try:
        with pytest.raises(BundleRejected, match=r"ends inside a blob member \(6000 bytes short\)"):
            copy_member(fd, 1000, 10_000, out)
    finally:
        os.close(fd)
        if out is not None:
            os.close(out)


def test_a_failed_member_copy_stops_those_not_begun_and_waits_for_those_under_way():
    """import copies members on several threads (bundle/read.py): at the first refusal, no member not yet
    begun is copied, and each one under way finishes before the refusal is raised (so every part it made
    is in `parts` when the import removes them)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from frt.mirror.bundle.extract import all_or_none
    from frt.mirror.bundle.format import BundleRejected

    ran, under_way, release, gate = [], threading.Event(), threading.Event(), threading.Event()

    def refused():
        under_way.wait(5)
        raise BundleRejected("tampered")

    def slow():
        under_way.set()
        release.wait(0.5)  # still running when the refusal comes
        ran.append("slow")

    def later(i):
        gate.wait(1)  # one per worker at most begins before the refusal cancels the rest
        ran.append(i)

    with ThreadPoolExecutor(max_workers=2) as pool:
        copying = [pool.submit(refused), pool.submit(slow), *(pool.submit(later, i) for i in range(20))]
        with pytest.raises(BundleRejected):
            all_or_none(copying)
        assert ran[0] == "slow"  # waited for, not abandoned
    assert len(ran) <= 3  # "slow" and the one each worker may have begun: the other 18 never began


def test_a_full_disk_on_import_is_a_local_error_not_a_rejected_bundle(home_a, tmp_path):
    """The home on a one-page tmpfs (its ledger elsewhere): the first blobs written fill it. That is the
    home's disk, not the bundle: a local disk error (exit 4), not "nothing was imported" for a bundle
    that is fine (exit 1), and no part is left (issue 50)."""
    import os
    import subprocess
    import sys

    from tests.support.cli import cli_env

    if os.geteuid() != 0:
        pytest.fail("needs root for a tmpfs mount namespace (CI runs as root)")
    exe = str(Path(sys.executable).with_name("frt-mirror"))
    home, ledger = tmp_path / "home", f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    home.mkdir()
    left = tmp_path / "left"
    script = (
        f"mount -t tmpfs -o size=4k tmpfs {home} && {exe} --home {home} --ledger {ledger} import {home_a.full}; "
        f"rc=$?; find {home} -name '*.part' > {left}; exit $rc"
    )
    args = ["unshare", "-m", "sh", "-c", script]
    p = subprocess.run(args, capture_output=True, text=True, env=cli_env(), timeout=120)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 4, p.stderr
    assert len(lines) == 1 and "No space left on device" in lines[0] and "a local disk error" in lines[0], p.stderr
    assert "nothing was imported" not in lines[0] and left.read_text() == ""
