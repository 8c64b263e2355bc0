"""Mirrors in tiers (issue 48): central stages from the Hub and serves; region pulls through from central;
cluster pulls through from region (tests/support/tiers.py). With the Hub stopped, unmodified clients at the
cluster work as they do against one mirror: kernels' get_kernel (v1, v2) and `kernels download`,
huggingface_hub's `hf download` and snapshot_download. Also in the huggingface_hub 1.33 venv (hub1).

One three-tier set for the module (each tier a real serve process); the tests that change central
(tamper, unstage, stop) come last in the file or build their own."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.hostile import HostileProxy
from tests.support.kernel_fixtures import ACTIVATION, LAYERNORM, ORG, RELU, X86_CPU
from tests.support.serve_helpers import client_env, raw_http, raw_request, run_client
from tests.support.tiers import MODEL, MODEL_ORG, pull_through, three_tiers

pytestmark = pytest.mark.hub1


@pytest.fixture(scope="module")
def tiers(tmp_path_factory):
    with three_tiers(tmp_path_factory.mktemp("tiers")) as t:
        yield t


def tool(name: str, *args: str, url: str, hf_home: Path, cwd: Path | None = None):
    """A console script of this venv (`hf`, `kernels`), as a cluster job runs it."""
    env = client_env(url, hf_home, HF_HUB_DISABLE_UPDATE_CHECK="1", HF_HUB_ETAG_TIMEOUT="60")
    exe = str(Path(sys.executable).with_name(name))
    return subprocess.run([exe, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=180)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


GET_BOTH = f"""
    import kernels
    a = kernels.get_kernel("{ACTIVATION}", version=1)
    b = kernels.get_kernel("{ACTIVATION}", version=2)
    report({{"v1": [a.VERSION, a.REVISION_NOTE, a.VARIANT], "v2": [b.VERSION, b.REVISION_NOTE, b.VARIANT]}})
"""


def test_get_kernel_v1_and_v2_at_the_cluster(tiers, tmp_path):
    p, out = run_client(GET_BOTH, tiers.cluster.url, tmp_path / "hf", timeout=180, HF_HUB_ETAG_TIMEOUT="60")
    assert out == {"v1": [1, "cu-rebuild", X86_CPU], "v2": [2, "v2.1", X86_CPU]}, p.stderr[-3000:]
    assert not tiers.hub_tripwire.hits


def test_kernels_lock_and_download_at_the_cluster(tiers, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        f'[project]\nname = "uses-kernels"\nversion = "0.1"\n\n[tool.kernels.dependencies]\n"{LAYERNORM}" = 1\n'
    )
    url = tiers.cluster.url
    p = tool("kernels", "lock", str(project), url=url, hf_home=tmp_path / "hf")
    assert p.returncode == 0, p.stderr[-3000:]
    locks = {
        e["dependency"]["repo-id"]: e["lock"]["commit"] for e in json.loads((project / "kernels.lock").read_text())
    }
    p = tool("kernels", "download", str(project), url=url, hf_home=tmp_path / "hf-dl")
    assert p.returncode == 0, p.stderr[-3000:]
    for repo, commit in locks.items():
        snap = tmp_path / "hf-dl" / "hub" / f"kernels--{repo.replace('/', '--')}" / "snapshots" / commit
        expect = {k: v for k, v in tiers.repos[repo].commits[commit].files.items() if v is not None}
        got = {str(f.relative_to(snap)): f.read_bytes() for f in (snap / "build" / X86_CPU).iterdir()}
        assert got and all(expect[name] == data for name, data in got.items()), repo
    assert set(locks) == {LAYERNORM, ACTIVATION}  # activation v2: layernorm's kernel-depends
    assert not tiers.hub_tripwire.hits


def test_hf_download_and_snapshot_download_of_a_model_at_the_cluster(tiers, tmp_path):
    expect = {p: sha(d) for p, d in tiers.files(MODEL, "main").items()}
    p = tool(
        "hf", "download", MODEL, "--local-dir", str(tmp_path / "out"), url=tiers.cluster.url, hf_home=tmp_path / "hf"
    )
    assert p.returncode == 0, p.stderr[-3000:]
    got = {
        str(f.relative_to(tmp_path / "out")): sha(f.read_bytes()) for f in (tmp_path / "out").rglob("*") if f.is_file()
    }
    assert {k: v for k, v in got.items() if not k.startswith(".cache")} == expect
    p, out = run_client(
        f"""
        from huggingface_hub import snapshot_download
        report(tree_sha256(snapshot_download({MODEL!r})))
        """,
        tiers.cluster.url,
        tmp_path / "hf2",
        timeout=180,
    )
    assert out == expect, p.stderr[-3000:]
    assert not tiers.hub_tripwire.hits


# -- trust and integrity: carried, never invented -------------------------------------------------


def raw(served, path: str) -> tuple[int, bytes]:
    status, _, body = raw_http(served.port, raw_request("GET", path), timeout=60)
    return status, body


def test_trust_digests_and_pins_reach_the_cluster_as_central_recorded_them(tiers):
    # The publisher's overview: trusted for the fixture org; the model org never vouched for (404 everywhere,
    # not a `false` nor a `true` invented on the way).
    for org in (ORG, MODEL_ORG):
        path = f"/api/organizations/{org}/overview"
        assert raw(tiers.cluster, path)[0] == raw(tiers.region, path)[0] == raw(tiers.central, path)[0]
    status, body = raw(tiers.cluster, f"/api/organizations/{ORG}/overview")
    assert status == 200 and json.loads(body)["trustedKernelPublisher"] is True
    assert raw(tiers.cluster, f"/api/organizations/{MODEL_ORG}/overview")[0] == 404
    # Pins: every version's commit, and the publisher's digest in each variant's metadata.json, byte for byte.
    for repo in (ACTIVATION, LAYERNORM):
        central_refs = json.loads(raw(tiers.central, f"/api/kernels/{repo}/refs")[1])
        assert json.loads(raw(tiers.cluster, f"/api/kernels/{repo}/refs")[1]) == central_refs
        for branch in central_refs["branches"]:
            commit = branch["targetCommit"]
            meta = f"/kernels/{repo}/resolve/{commit}/build/{X86_CPU}/metadata.json"
            status, body = raw(tiers.cluster, meta)
            assert status == 200 and body == raw(tiers.central, meta)[1], (repo, branch)
            assert (
                json.loads(body)["digest"]
                == json.loads(tiers.repos[repo].commits[commit].files[meta.split(f"{commit}/")[1]])["digest"]
            )


def stored(home: Path, data: bytes) -> Path:
    digest = sha(data)
    return home / "store" / "sha256" / digest[:2] / digest


def test_a_tampered_blob_at_central_never_reaches_the_cluster(tiers, tmp_path):
    """An operator's edit at central (a flipped bit): the region refuses what fails its checks, stores
    nothing, and the cluster's client fails as it would against a bad Hub, with no wrong file anywhere."""
    commit = tiers.repos[RELU].branches["v1"]
    path = f"build/{X86_CPU}/__init__.py"
    good = tiers.files(RELU, "v1")[path]
    blob = stored(tiers.central_home, good)
    blob.chmod(0o644)
    bad = bytes([good[0] ^ 0x01]) + good[1:]
    with open(blob, "r+b") as f:  # in place, as `dd conv=notrunc` would: size and name unchanged
        f.write(bad[:1])
    p, out = run_client(
        f"""
        import kernels
        try:
            k = kernels.get_kernel("{RELU}", version=1)
            report({{"loaded": k.REVISION_NOTE}})
        except Exception as e:
            report({{"error": type(e).__name__}})
        """,
        tiers.cluster.url,
        tmp_path / "hf",
        timeout=180,
        HF_HUB_ETAG_TIMEOUT="60",
    )
    assert out is not None and "error" in out, (out, p.stderr[-3000:])
    for served in (tiers.cluster, tiers.region):
        status, body = raw(served, f"/kernels/{RELU}/resolve/{commit}/{path}")
        assert status != 200 and bad not in body, (served.url, status)
    for home in (tiers.region_home, tiers.cluster_home):
        assert not stored(home, bad).exists() and not stored(home, good).exists(), home
    cached = [f for f in (tmp_path / "hf").rglob("__init__.py") if f.is_file() and "relu" in str(f)]
    assert all(f.read_bytes() != bad for f in cached), cached


def flipped_body(h, fwd) -> None:
    """The upstream's answer with one bit of its body flipped, headers (ETag, X-Linked-Etag) kept."""
    f = fwd()
    body = bytes([f.body[0] ^ 0x01]) + f.body[1:] if f.body and h.command == "GET" else f.body
    h.send(f.status, body, f.headers)


def test_a_central_that_sends_wrong_bytes_is_refused_by_the_region(tiers, tmp_path):
    """Central's own check (above) aside: a central that sends other bytes than it listed (an older
    frt-mirror without integrity on read, a broken middlebox) is refused by the region's own verification
    (the listing's LFS sha256) and the cluster never gets them."""
    so = f"build/{X86_CPU}/_activation.abi3.so"
    good = tiers.files(ACTIVATION, "v1")[so]
    with HostileProxy(tiers.central.url) as proxy:
        rule = proxy.rule("/_activation.abi3.so", flipped_body)
        with (
            pull_through(tmp_path / "region", proxy.url) as region,
            pull_through(tmp_path / "cluster", region.url) as cluster,
        ):
            p, out = run_client(
                f"""
                import kernels
                try:
                    report({{"loaded": kernels.get_kernel("{ACTIVATION}", version=1).REVISION_NOTE}})
                except Exception as e:
                    report({{"error": type(e).__name__}})
                """,
                cluster.url,
                tmp_path / "hf",
                timeout=180,
                HF_HUB_ETAG_TIMEOUT="60",
            )
            assert out is not None and "error" in out, (out, p.stderr[-3000:])
            commit = tiers.repos[ACTIVATION].branches["v1"]
            status, body = raw(cluster, f"/kernels/{ACTIVATION}/resolve/{commit}/{so}")
            assert status != 200 and body != good, status
            assert raw(region, f"/kernels/{ACTIVATION}/resolve/{commit}/{so}")[0] == 502  # the region's refusal
            assert proxy.hits(rule) >= 1
    for home in ("region", "cluster"):
        blobs = [f for f in (tmp_path / home / "store").rglob("*") if f.is_file()]
        assert all(f.read_bytes()[1:] != good[1:] for f in blobs), home  # neither the good nor the flipped copy
    cached = [f for f in (tmp_path / "hf").rglob("_activation.abi3.so") if f.is_file()]
    assert cached == [], cached
