"""Signed bundles: `key new` on the connected box, `bundle --sign`, `import --require-signature` on the
cluster. An unsigned bundle, one signed by another key, and one with a single byte flipped anywhere are
each refused in one line before anything is written; a good signature imports."""

from __future__ import annotations

import json
import stat
import subprocess
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support.bundles import import_offline, snapshot_data
from tests.support.cli import X86, run_cli, write_manifest
from tests.support.fakehub import FakeHub
from tests.support.homes import empty_home
from tests.support.kernel_fixtures import ORG, RELU, demo_repos
from tests.support.offline import NO_NET


def key_new(path: Path, home: Path) -> subprocess.CompletedProcess:
    return run_cli("key", "new", str(path), "--json", home=home)


@pytest.fixture(scope="module")
def signed(tmp_path_factory) -> SimpleNamespace:
    """A home with relu v1 staged for x86, two key pairs, and its bundle signed, signed by the other
    key, and unsigned."""
    root = tmp_path_factory.mktemp("signed")
    home = root / "home"
    m = write_manifest(root / "m.toml", {RELU: {"version": 1}}, [X86])
    with FakeHub(demo_repos(), trusted_orgs=[ORG]) as hub:
        assert run_cli("--endpoint", hub.url, "stage", str(m), home=home).returncode == 0
    keys = {}
    for name in ("site", "other"):
        p = key_new(root / name, home)
        assert p.returncode == 0, p.stderr
        keys[name] = json.loads(p.stdout)
    tars = {n: root / f"{n}.tar" for n in ("good", "other", "unsigned")}
    for name, extra in (
        ("good", ["--sign", str(root / "site")]),
        ("other", ["--sign", str(root / "other")]),
        ("unsigned", []),
    ):
        p = run_cli("bundle", str(tars[name]), "--json", *extra, home=home)
        assert p.returncode == 0, p.stderr
    return SimpleNamespace(root=root, home=home, keys=keys, tar=tars, pub=root / "site.pub")


@pytest.fixture
def cluster(tmp_path) -> Path:
    """A cluster home that exists (its ledger created) and holds nothing yet."""
    return empty_home(tmp_path / "cluster")


def test_key_new_writes_a_private_and_a_public_key_and_never_overwrites(signed, tmp_path):
    key, pub = signed.root / "site", signed.root / "site.pub"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert b"BEGIN PRIVATE KEY" in key.read_bytes() and b"BEGIN PUBLIC KEY" in pub.read_bytes()
    assert signed.keys["site"]["key_id"] != signed.keys["other"]["key_id"]
    # openssl reads both as ed25519 (a standard format, not one of ours).
    out = subprocess.run(["openssl", "pkey", "-in", str(key), "-noout", "-text"], capture_output=True, text=True)
    assert out.returncode == 0 and "ED25519" in out.stdout.upper(), out.stderr
    before = (key.read_bytes(), pub.read_bytes())
    p = key_new(key, tmp_path / "h")
    assert p.returncode == 2 and "never overwritten" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert (key.read_bytes(), pub.read_bytes()) == before
    (tmp_path / "k.pub").write_text("someone's\n")  # the .pub alone is in the way: refused too
    p = key_new(tmp_path / "k", tmp_path / "h")
    assert p.returncode == 2 and "k.pub exists" in p.stderr and not (tmp_path / "k").exists()


def test_a_good_signature_imports(signed, cluster):
    p = import_offline(cluster, signed.tar["good"], "--require-signature", str(signed.pub), "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["signed_by"] == signed.keys["site"]["key_id"]
    assert run_cli("verify", home=cluster, wrap=NO_NET).returncode == 0
    assert run_cli("env", "--target", X86, home=cluster, wrap=NO_NET).returncode == 0
    # Without --require-signature a signed bundle imports as any other (its signature unchecked).
    p = import_offline(cluster, signed.tar["good"], "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["new_blobs"] == 0, p.stderr


def _flip(src: Path, dst: Path, member: str, at: int | None = None, base64: bool = False) -> None:
    """Copy src with one byte changed inside `member`'s data, `at` bytes from its start (default: its
    middle): its low bit flipped, or with `base64` swapped for another base64 letter (a flipped bit can
    make a character base64 does not have, a malformed signature rather than a wrong one)."""
    with tarfile.open(src) as tf:
        m = tf.getmember(member)
    at = m.offset_data + (m.size // 2 if at is None else at)
    data = bytearray(src.read_bytes())
    data[at] = (ord("B") if data[at] == ord("A") else ord("A")) if base64 else data[at] ^ 0x01
    dst.write_bytes(bytes(data))


def _largest_blob(tar: Path) -> str:
    with tarfile.open(tar) as tf:
        return max((m for m in tf if m.name.startswith("blobs/")), key=lambda m: m.size).name


@pytest.mark.parametrize(
    "case, says",
    [
        ("unsigned", "the bundle is not signed"),
        ("other", "not by the required key"),
        ("flip-manifest", "the bundle was altered after signing"),
        ("flip-signature", "does not match the manifest: the bundle was altered after signing"),
        ("flip-blob", "is tampered or damaged"),
    ],
)
def test_bad_signatures_are_refused_and_nothing_is_written(signed, cluster, tmp_path, case, says):
    tar = tmp_path / "bad.tar"
    if case in ("unsigned", "other"):
        tar = signed.tar[case]
    elif case == "flip-manifest":
        _flip(signed.tar["good"], tar, "frt-bundle.json")
    elif case == "flip-signature":
        with tarfile.open(signed.tar["good"]) as tf:
            sig = tf.extractfile("frt-bundle.sig").read()
        _flip(signed.tar["good"], tar, "frt-bundle.sig", at=sig.index(b'"signature": "') + 20, base64=True)
    else:
        _flip(signed.tar["good"], tar, _largest_blob(signed.tar["good"]))
    before = snapshot_data(cluster)
    p = import_offline(cluster, tar, "--require-signature", str(signed.pub))
    assert p.returncode == 1, (p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert says in lines[0] and "nothing was imported" in lines[0], lines[0]
    assert snapshot_data(cluster) == before


def test_a_format_1_bundle_is_unsigned(signed, cluster):
    old = Path(__file__).parent / "data" / "v4" / "relu-v1.tar"
    p = import_offline(cluster, old, "--require-signature", str(signed.pub))
    assert p.returncode == 1 and "not signed" in p.stderr, p.stderr


@pytest.mark.parametrize(
    "args, says",
    [
        (lambda s: ["bundle", str(s.root / "x.tar"), "--sign", str(s.pub)], "is a public key"),
        (lambda s: ["import", str(s.tar["good"]), "--require-signature", str(s.root / "site")], "is a private key"),
        (lambda s: ["import", str(s.tar["good"]), "--require-signature", str(s.tar["good"])], "not a PEM public key"),
    ],
    ids=["sign-with-pub", "require-private", "require-junk"],
)
def test_a_key_of_the_wrong_kind_is_bad_input(signed, cluster, args, says):
    p = run_cli(*args(signed), home=cluster)
    assert p.returncode == 2 and says in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not (signed.root / "x.tar").exists()


@pytest.mark.parametrize("case", ["unsigned", "other"])
def test_a_refused_import_into_no_home_leaves_no_home(signed, tmp_path, case):
    """Issue 30, item 6: a refused signed import created an empty home (folders and a ledger) first."""
    home = tmp_path / "new-cluster"
    p = import_offline(home, signed.tar[case], "--require-signature", str(signed.pub))
    assert p.returncode == 1 and "nothing was imported" in p.stderr, p.stderr
    assert not home.exists(), sorted(str(x) for x in home.rglob("*"))
