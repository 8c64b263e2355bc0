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

from tests.support.kernel_fixtures import ACTIVATION, LAYERNORM, X86_CPU
from tests.support.serve_helpers import client_env, run_client
from tests.support.tiers import MODEL, three_tiers

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
