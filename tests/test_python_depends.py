"""The Python packages a kernel needs: a variant's metadata.json `python-depends` (kernels' curated list),
fetched as wheels from a package index, verified by the index's sha256, stored beside the kernels,
carried in bundles, and handed to an offline cluster three ways.

The upstream is `kernels-test/einsum` on the fake Hub (its builds name einops) and a local PEP 503
index of wheels built here (tests/support/wheel_index.py): no network. kernels 0.17.2 refuses to load a
variant whose python-depends it cannot import, so the proof is an unmodified `kernels.get_kernel` inside
`unshare -n` after `pip install` through each hand-off, and the same load failing without it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.cli import cli_env, run_cli, write_manifest
from tests.support.fakehub import FakeHub
from tests.support.kernel_fixtures import ORG, X86_CPU, einsum_repo
from tests.support.offline import NO_NET
from tests.support.wheel_index import LocalIndex, make_wheel

pytestmark = pytest.mark.hub1

EINSUM = f"{ORG}/einsum"
X86 = "torch2.13-cpu-x86_64-linux"
EINOPS = "einops-0.8.1-py3-none-any.whl"
YANKED = "einops-0.9.0-py3-none-any.whl"
EINOPS_PY = {"einops/__init__.py": '__version__ = "0.8.1"\nMADE_BY = "frt-tests"\n'}


@pytest.fixture
def hub():
    with FakeHub([einsum_repo()], trusted_orgs=[ORG]) as h:
        yield h


@pytest.fixture
def wheels(tmp_path) -> Path:
    """einops as an index would hold it: the release, an older one, a pre-release and a newer one (which
    the tests mark yanked, but one)."""
    folder = tmp_path / "index"
    make_wheel(folder, "einops", "0.8.1", EINOPS_PY)
    make_wheel(folder, "einops", "0.7.0", {"einops/__init__.py": '__version__ = "0.7.0"\n'})
    make_wheel(folder, "einops", "0.9.0rc1", {"einops/__init__.py": '__version__ = "0.9.0rc1"\n'})
    make_wheel(folder, "einops", "0.9.0", {"einops/__init__.py": '__version__ = "0.9.0"\n'})
    return folder


def stage(hub, home, index_url, manifest, *extra):
    p = run_cli("--endpoint", hub.url, "stage", str(manifest), "--wheel-index", index_url, "--json", *extra, home=home)
    assert p.stdout, p.stderr
    return p, json.loads(p.stdout)


def test_stage_fetches_the_wheel_python_depends_name_verified_and_verify_checks_it(hub, home, tmp_path, wheels):
    m = write_manifest(tmp_path / "m.toml", {EINSUM: {"version": 1}}, [X86])
    with LocalIndex(wheels, yanked={YANKED}) as index:
        p, doc = stage(hub, home, index.url, m)
        assert p.returncode == 0, p.stderr
        [row] = doc["rows"]
        # The newest release that is not yanked or a pre-release, as pip would choose.
        assert (row["variant"], row["wheels"]) == (X86_CPU, [EINOPS])
        link = home / "views" / "wheels" / EINOPS
        assert link.read_bytes() == (wheels / EINOPS).read_bytes()
        assert os.stat(link).st_nlink >= 2  # a hard link into the store, not a copy
        served = list(index.requests)
        p2, doc2 = stage(hub, home, index.url, m)  # a rerun reads the page again, downloads nothing
        assert p2.returncode == 0 and doc2["downloaded_bytes"] == 0, p2.stderr
        assert [r for r in index.requests[len(served) :] if r.startswith("/files/")] == []
    v = run_cli("verify", "--json", home=home)
    assert v.returncode == 0 and json.loads(v.stdout)["wheels"] == 1, v.stdout
    link.unlink()
    v = run_cli("verify", "--json", home=home)
    assert v.returncode == 1 and any(EINOPS in x for x in json.loads(v.stdout)["problems"]), v.stdout


def test_a_wheel_whose_bytes_are_not_what_the_index_says_is_never_stored(hub, home, tmp_path, wheels):
    m = write_manifest(tmp_path / "m.toml", {EINSUM: {"version": 1}}, [X86])
    with LocalIndex(wheels, corrupt={EINOPS}, yanked={YANKED}) as index:
        p, doc = stage(hub, home, index.url, m)
    assert p.returncode == 1 and doc["rows"][0]["status"] == "failed", p.stdout
    assert "sha256" in doc["rows"][0]["detail"] and "not stored" in doc["rows"][0]["detail"]
    assert not (home / "views" / "wheels" / EINOPS).exists()
    assert run_cli("env", "--target", X86, home=home).returncode == 2  # nothing is staged for it


def test_a_page_without_hashes_offers_nothing_and_the_line_says_how_to_get_binary_wheels(hub, home, tmp_path):
    folder = tmp_path / "index"
    make_wheel(folder, "einops", "0.8.1", EINOPS_PY, tag="cp312-cp312-manylinux_2_28_x86_64")
    m = write_manifest(tmp_path / "m.toml", {EINSUM: {"version": 1}}, [X86])
    with LocalIndex(folder) as index:
        p, doc = stage(hub, home, index.url, m)
        plain = run_cli("--endpoint", hub.url, "stage", str(m), "--wheel-index", index.url, home=home)
    assert p.returncode == 1 and doc["rows"][0]["status"] == "refused", p.stdout
    assert 'python = "3.12"' in doc["rows"][0]["detail"] and "no wheel of einops" in doc["rows"][0]["detail"]
    assert plain.returncode == 1 and plain.stderr.strip().splitlines() == [
        f"frt-mirror: refused: {doc['rows'][0]['detail']}"
    ], plain.stderr
    with LocalIndex(tmp_path / "index", no_hash=True) as index:  # pure wheels, but no digest to check them by
        make_wheel(folder, "einops", "0.8.1", EINOPS_PY)
        p, doc = stage(hub, home, index.url, m)
    assert p.returncode == 1 and doc["rows"][0]["status"] == "refused", p.stdout


def test_a_target_naming_its_python_gets_binary_wheels_and_their_requirements(hub, home, tmp_path):
    folder = tmp_path / "index"
    make_wheel(
        folder,
        "einops",
        "0.8.1",
        EINOPS_PY,
        tag="cp312-cp312-manylinux_2_28_x86_64",
        requires=("tinydep>=1.1", "torch>=2", 'winonly; sys_platform == "win32"', 'extra-only; extra == "x"'),
    )
    make_wheel(folder, "einops", "0.8.1", EINOPS_PY, tag="cp311-cp311-manylinux_2_28_x86_64")
    make_wheel(folder, "tinydep", "1.0", {"tinydep/__init__.py": ""})
    make_wheel(folder, "tinydep", "1.2", {"tinydep/__init__.py": ""})
    make_wheel(folder, "winonly", "1.0", {"winonly/__init__.py": ""})
    m = tmp_path / "m.toml"
    m.write_text(f'[[targets]]\ntarget = "{X86}"\npython = "3.12"\n\n[kernels]\n"{EINSUM}" = {{ version = 1 }}\n')
    with LocalIndex(folder) as index:
        p, doc = stage(hub, home, index.url, m)
        assert p.returncode == 0, p.stderr
        assert not any("torch" in r or "winonly" in r for r in index.requests), index.requests
    assert doc["rows"][0]["wheels"] == [
        "einops-0.8.1-cp312-cp312-manylinux_2_28_x86_64.whl",
        "tinydep-1.2-py3-none-any.whl",
    ]
    m.write_text(m.read_text().replace('"3.12"', "3.12"))
    p = run_cli("stage", str(m), home=home)
    assert p.returncode == 2 and "python" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_bundles_carry_the_wheels_and_an_import_lays_them_out(hub, home, tmp_path, wheels):
    m = write_manifest(tmp_path / "m.toml", {EINSUM: {"version": 1}}, [X86])
    with LocalIndex(wheels, yanked={YANKED}) as index:
        assert stage(hub, home, index.url, m)[0].returncode == 0
    tar = tmp_path / "k.tar"
    p = run_cli("bundle", str(tar), "--json", home=home)
    assert p.returncode == 0, p.stderr
    import tarfile

    with tarfile.open(tar) as tf:
        doc = json.loads(tf.extractfile("frt-bundle.json").read())
    assert doc["format"] == 5 and [w["filename"] for w in doc["wheels"]] == [EINOPS]
    assert any(b["sha256"] == doc["wheels"][0]["sha256"] for b in doc["blobs"])
    cluster = tmp_path / "cluster"
    p = run_cli("import", str(tar), home=cluster)
    assert p.returncode == 0, p.stderr
    assert (cluster / "views" / "wheels" / EINOPS).read_bytes() == (wheels / EINOPS).read_bytes()
    assert json.loads(run_cli("verify", "--json", home=cluster).stdout)["wheels"] == 1
    # An incremental bundle on it carries neither the wheel nor its record: nothing changed.
    p = run_cli("bundle", str(tmp_path / "k2.tar"), "--since", str(tar), "--json", home=home)
    assert p.returncode == 0 and json.loads(p.stdout)["blobs"] == 0, p.stdout


LOAD = f"""
import kernels
k = kernels.get_kernel({EINSUM!r}, version=1)
from importlib import import_module
print("loaded", k.VARIANT, import_module(k.__name__ + ".ops").einops_version())
"""


def test_the_cluster_installs_the_wheels_through_each_handoff_and_kernels_loads(hub, home, tmp_path, wheels):
    """On the cluster, inside `unshare -n`: import the bundle; first the load fails as kernels fails it
    without einops; then for each hand-off (env's PIP_FIND_LINKS, export-cache's folder, serve's /simple/)
    `pip install` into a fresh folder and the same load succeeds with that folder on PYTHONPATH."""
    m = write_manifest(tmp_path / "m.toml", {EINSUM: {"version": 1}}, [X86])
    with LocalIndex(wheels, yanked={YANKED}) as index:
        assert stage(hub, home, index.url, m)[0].returncode == 0
    tar = tmp_path / "k.tar"
    assert run_cli("bundle", str(tar), home=home).returncode == 0
    hub.stop()
    cluster, load = tmp_path / "srv-frt", tmp_path / "load.py"
    load.write_text(LOAD)
    pip = "python -m pip install -q --disable-pip-version-check --no-cache-dir"
    script = tmp_path / "cluster.sh"
    script.write_text(
        textwrap.dedent(f"""\
        set -eu
        ip link set lo up
        export FRT_MIRROR_HOME={cluster}
        frt-mirror import {tar} >/dev/null
        # without einops: kernels itself refuses the load
        (eval "$(frt-mirror env --target {X86})"; python {load} 2>&1 | tail -1) || true
        # 1. env: PIP_FIND_LINKS, and the install line it prints
        (eval "$(frt-mirror env --target {X86})"
         line=$(frt-mirror env --target {X86} | sed -n 's/^# python-depends: .*: //p')
         ${{line/pip install/{pip} --target {tmp_path}/t1}}
         PYTHONPATH={tmp_path}/t1 python {load})
        # 2. export-cache: a find-links folder beside the Hub cache
        frt-mirror export-cache {tmp_path}/hf-cache --target {X86} >/dev/null
        {pip} --target {tmp_path}/t2 --no-index --find-links {tmp_path}/hf-cache-wheels einops
        (HF_HUB_CACHE={tmp_path}/hf-cache HF_HUB_OFFLINE=1 PYTHONPATH={tmp_path}/t2 python {load})
        # 3. serve: a PEP 503 index at /simple/
        frt-mirror serve --port 8471 2>{tmp_path}/serve.log &
        for i in $(seq 100); do python -c 'import socket; socket.create_connection(("127.0.0.1", 8471))' \\
            2>/dev/null && break; sleep 0.1; done
        {pip} --target {tmp_path}/t3 --index-url http://127.0.0.1:8471/simple/ einops
        (eval "$(frt-mirror env --serve http://127.0.0.1:8471)"; HF_HOME={tmp_path}/hf PYTHONPATH={tmp_path}/t3 \\
         python {load})
        kill %1
    """)
    )
    # pip as on a bare cluster: no pip.conf (this box's names a local wheelhouse that holds einops too)
    env = {**{k: v for k, v in cli_env().items() if not k.startswith("PIP_")}, "PIP_CONFIG_FILE": os.devnull}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    p = subprocess.run([*NO_NET, "bash", str(script)], capture_output=True, text=True, env=env, timeout=300)
    log = (tmp_path / "serve.log").read_text() if (tmp_path / "serve.log").exists() else ""
    assert p.returncode == 0, p.stdout + p.stderr + log
    lines = p.stdout.splitlines()
    assert "requires Python dependency `einops`" in lines[0], p.stdout
    assert lines[1:] == [f"loaded {X86_CPU} 0.8.1"] * 3, p.stdout


# -- the index's pages and the choice of wheel, as data ---------------------------------------------------


def test_a_hostile_index_page_offers_only_files_it_vouches_for_under_plain_names():
    from frt.resolver.wheel_index import _from_html, _from_json

    sha = "a" * 64
    page = (
        f'<a href="../../files/einops-0.8.1-py3-none-any.whl#sha256={sha}">einops-0.8.1-py3-none-any.whl</a>'
        f'<a href="/x#sha256={sha}">../../../etc/passwd.whl</a><a href="/y#md5=abc">einops-0.8.2-py3-none-any.whl</a>'
        f'<a href="/z#sha256={sha}">.hidden-1.0-py3-none-any.whl</a><a>no href</a>'
        f'<a href="file:///etc/shadow#sha256={sha}" data-yanked="">einops-0.8.0-py3-none-any.whl</a>'
    )
    got = _from_html(page.encode(), "http://idx/simple/einops/", "index")
    assert [(f.filename, f.url, f.yanked) for f in got] == [
        ("einops-0.8.1-py3-none-any.whl", "http://idx/files/einops-0.8.1-py3-none-any.whl", False),
        ("einops-0.8.0-py3-none-any.whl", "file:///etc/shadow", True),
    ]  # fetched only over http(s): below
    doc = {
        "files": [
            {
                "filename": "einops-0.8.1-py3-none-any.whl",
                "url": "/f",
                "hashes": {"sha256": sha},
                "size": 12,
                "requires-python": ">=3.9",
            },
            {"filename": "a/b-1.0-py3-none-any.whl", "url": "/g", "hashes": {"sha256": sha}},
        ]
    }
    [only] = _from_json(doc, "http://idx/simple/einops/", "index")
    assert (only.url, only.size, only.requires_python) == ("http://idx/f", 12, ">=3.9")


def test_a_wheel_url_off_http_is_refused_in_one_line(tmp_path):
    from frt.mirror.stage.wheels import _get_to
    from frt.mirror.store.scratch import Scratch
    from frt.resolver import wire
    from frt.resolver.errors import UpstreamMalformed
    from frt.resolver.pacing import Pacer

    part = Scratch(tmp_path).part_path("x")
    with pytest.raises(UpstreamMalformed, match="not an http"):
        _get_to("file:///etc/shadow", part, 100, wire.Limits(), Pacer())
    assert not part.exists()


def test_the_choice_of_wheel_follows_pip():
    from dataclasses import replace

    from packaging.requirements import Requirement

    from frt.resolver.targets import parse_target
    from frt.resolver.wheel_index import IndexFile
    from frt.resolver.wheel_pick import pick, requires

    def f(name, **kw):
        return IndexFile(name, f"http://i/{name}", "0" * 64, **kw)

    files = [
        f("einops-0.8.1-py3-none-any.whl"),
        f("einops-0.8.1-cp312-cp312-manylinux_2_28_x86_64.whl"),
        f("einops-0.9.0-py3-none-any.whl", yanked=True),
        f("einops-1.0.0rc1-py3-none-any.whl"),
        f("einops-0.8.5-cp312-cp312-win_amd64.whl"),
        f("einops-0.8.9-py3-none-any.whl", requires_python=">=3.13"),
        f("einops-0.8.1.tar.gz"),
    ]
    cpu = parse_target(X86)
    assert pick(files, cpu, Requirement("einops")).file.filename == "einops-0.8.9-py3-none-any.whl"  # Python unknown
    py312 = replace(cpu, python="3.12")
    assert (
        pick(files, py312, Requirement("einops")).file.filename == "einops-0.8.1-cp312-cp312-manylinux_2_28_x86_64.whl"
    )  # the most specific tag of the newest that fits
    assert pick(files, py312, Requirement("einops<0.8")) is None
    assert pick([f("einops-0.9.0-py3-none-any.whl", yanked=True)], cpu, Requirement("einops")) is not None
    meta = (
        b"Name: x\nRequires-Dist: a\nRequires-Dist: torch>=2\nRequires-Dist: b; sys_platform == 'win32'\n"
        b"Requires-Dist: c; python_version < '3.10'\nRequires-Dist: d; extra == 'dev'\nRequires-Dist: not a req!\n"
    )
    assert [r.name for r in requires(meta, cpu)] == ["a", "c"]  # Python unknown: c holds for some 3.9..3.14
    assert [r.name for r in requires(meta, py312)] == ["a"]


def test_on_an_object_store_the_wheels_are_objects_and_env_into_writes_them(
    hub, tmp_path, wheels, pg_url, s3_server, s3_store
):
    """`--store s3://…`: the wheel is stored as an object beside the kernels' (no find-links folder: the home
    has no views), a rerun finds it there and downloads nothing, verify checks it, and env --into writes it
    where PIP_FIND_LINKS points."""
    m = write_manifest(tmp_path / "m.toml", {EINSUM: {"version": 1}}, [X86])
    env, home = cli_env(**s3_server.env()), tmp_path / "home"
    common = ["--ledger", pg_url, "--store", s3_store]
    with LocalIndex(wheels, yanked={YANKED}) as index:
        for downloaded in (True, False):
            args = [*common, "--endpoint", hub.url, "stage", str(m), "--wheel-index", index.url, "--json"]
            p = run_cli(*args, home=home, env=env)
            assert p.returncode == 0, p.stdout + p.stderr
            assert (json.loads(p.stdout)["downloaded_bytes"] > 0) == downloaded, p.stdout
    assert not (home / "views").exists()
    v = run_cli(*common, "verify", "--json", home=home, env=env)
    assert v.returncode == 0 and json.loads(v.stdout)["wheels"] == 1, v.stdout
    into = tmp_path / "node"
    p = run_cli(*common, "env", "--target", X86, "--into", str(into), home=home, env=env)
    assert p.returncode == 0, p.stderr
    assert (into / "wheels" / EINOPS).read_bytes() == (wheels / EINOPS).read_bytes()
