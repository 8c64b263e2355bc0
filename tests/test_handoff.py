"""The hand-off as a new user runs it: a staging box without torch, a bundle carried across, and
unmodified clients on the offline side (`kernels.get_kernel` in subprocesses, inside `unshare -n`).

Each of these broke once while every test upstream and manifest was shaped like our own code: a
target recorded as ``notorch-…`` that no importer accepts; `serve` refusing every kernel as untrusted
unless the manifest carried a `[trust]` table; `LOCAL_KERNELS` loading v2's code for `version=1`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from frt.resolver.targets import parse_target
from tests.support.cli import X86, cli_env, run_cli, run_cli_process, write_manifest
from tests.support.fakehub import FakeHub
from tests.support.kernel_fixtures import ACTIVATION, LAYERNORM, ORG, RELU, demo_repos
from tests.support.offline import NO_NET, load_offline
from tests.support.serve_helpers import free_port, raw_http, raw_request, run_client, serving

pytestmark = pytest.mark.hub1

# A sitecustomize that makes this interpreter a box without torch, as `kernels` and we detect it.
NO_TORCH = """
import importlib.abc, importlib.util, sys
class _NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, _NoTorch())
_find_spec = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a, **k: None if name == "torch" else _find_spec(name, *a, **k)
"""


def no_torch_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a box without torch: a process's (run_cli_process), which reads PYTHONPATH and
    its sitecustomize as it starts."""
    site = tmp_path / "no-torch-site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(NO_TORCH)
    return cli_env(PYTHONPATH=str(site), **extra)


def test_the_no_torch_shim_hides_torch(tmp_path):
    code = "import kernels.compat as c, sys; print(c.has_torch, 'torch' in sys.modules)"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=no_torch_env(tmp_path))
    assert p.stdout.split() == ["False", "False"], p.stderr


# -- 1. a target the parser would refuse is never recorded ------------------------------------------


def test_target_host_without_torch_is_refused_with_one_line(hub, home, tmp_path):
    m = write_manifest(tmp_path / "m.toml", {RELU: {"version": 1}}, [X86])
    env = no_torch_env(tmp_path)
    p = run_cli_process("--endpoint", hub.url, "stage", str(m), "--target", "host", home=home, env=env)
    assert p.returncode == 2, p.stdout
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs torch" in lines[0] and "name the cluster's target" in lines[0], p.stderr
    assert not (home / "ledger.sqlite").exists() or "notorch" not in (home / "ledger.sqlite").read_bytes().decode(
        "latin-1"
    )


@settings(max_examples=300, deadline=None)
@given(
    major=st.integers(1, 9),
    minor=st.integers(0, 99),
    backend=st.one_of(
        st.just("cpu"),
        st.just("metal"),
        st.just("neuron"),
        st.just("tpu"),
        st.builds("cu{}{}".format, st.integers(11, 13), st.integers(0, 9)),
        st.builds("rocm{}{}".format, st.integers(5, 7), st.integers(0, 9)),
        st.builds("xpu{}{}".format, st.integers(2024, 2026), st.integers(0, 9)),
        st.builds("cann{}{}".format, st.integers(7, 8), st.integers(0, 9)),
    ),
    cpu=st.sampled_from(["x86_64", "aarch64"]),
    os=st.sampled_from(["linux", "darwin", "windows"]),
)
def test_every_target_the_grammar_accepts_round_trips(major, minor, backend, cpu, os):
    """What is recorded is str(target); a bundle's import re-parses exactly that string."""
    text = f"torch{major}.{minor}-{backend}-{cpu}-{os}"
    target = parse_target(text)
    assert str(target) == text
    assert parse_target(str(target)) == target


def test_a_box_without_torch_stages_a_named_target_and_its_bundle_imports(hub, home, tmp_path):
    m = write_manifest(tmp_path / "m.toml", {ACTIVATION: {"version": 1}, RELU: {"version": 1}}, [X86])
    env = no_torch_env(tmp_path)
    p = run_cli_process("--endpoint", hub.url, "stage", str(m), home=home, env=env)
    assert p.returncode == 0, p.stderr
    tar = tmp_path / "k.tar"
    assert run_cli_process("bundle", str(tar), home=home, env=env).returncode == 0
    cluster = tmp_path / "cluster"
    p = run_cli("import", str(tar), "--json", home=cluster, wrap=NO_NET, env=env)
    assert p.returncode == 0, p.stderr
    assert {r["target"] for r in json.loads(p.stdout)["staged"]} == {X86}


# -- 2. trust is the upstream's word --------------------------------------------------------------


def _overview(port: int) -> tuple[int, dict | None]:
    status, _, body = raw_http(port, raw_request("GET", f"/api/organizations/{ORG}/overview"))
    return status, json.loads(body) if status == 200 else None


LOAD_OR_REFUSAL = f"""
    import kernels
    try:
        report(kernels.get_kernel({RELU!r}, version=1).REVISION_NOTE)
    except ValueError as e:
        report(str(e))
"""


@pytest.fixture
def untrusting_hub():
    """An upstream that does not call the fixture org a trusted publisher."""
    with FakeHub(demo_repos(), trusted_orgs=[], page_size=5) as h:
        yield h


def test_an_org_the_upstream_calls_untrusted_stays_untrusted_through_serve(untrusting_hub, home, tmp_path):
    # The manifest's [trust] lists the org: that restricts what may be staged, it grants nothing.
    m = write_manifest(tmp_path / "m.toml", {RELU: {"version": 1}}, [X86], trust=[ORG])
    assert run_cli("--endpoint", untrusting_hub.url, "stage", str(m), home=home).returncode == 0
    with serving(home) as mirror:
        assert _overview(mirror.port) == (200, {"name": ORG, "fullname": ORG, "trustedKernelPublisher": False})
        p, out = run_client(LOAD_OR_REFUSAL, mirror.url, tmp_path / "hf")
        assert out and "is not from a trusted publisher" in out, p.stderr
        p, out = run_client(
            LOAD_OR_REFUSAL.replace("version=1)", "version=1, trust_remote_code=True)"), mirror.url, tmp_path / "hf2"
        )
        assert out == "cpu", p.stderr
    with serving(home, "--trust", ORG) as mirror:  # the operator's override, and it says so
        assert _overview(mirror.port)[1]["trustedKernelPublisher"] is True
        p, out = run_client(LOAD_OR_REFUSAL, mirror.url, tmp_path / "hf3")
        assert out == "cpu", p.stderr


def test_staging_an_org_the_upstream_calls_untrusted_says_so(untrusting_hub, hub, home, tmp_path):
    """Issue 30, item 6: it said nothing, and the cluster learned it from kernels' refusal at load time."""
    m = write_manifest(tmp_path / "m.toml", {RELU: {"version": 1}}, [X86])
    p = run_cli("--endpoint", untrusting_hub.url, "stage", str(m), home=home)
    notes = [ln for ln in p.stderr.splitlines() if "a trusted kernel publisher" in ln]
    assert p.returncode == 0 and len(notes) == 1, p.stderr
    assert notes[0] == (
        f"frt-mirror: note: the upstream does not call {ORG} a trusted kernel publisher: kernels on the cluster will "
        f"refuse its kernels unless trust_remote_code=True (or serve --trust {ORG})"
    )
    p = run_cli("--endpoint", untrusting_hub.url, "stage", str(m), "--json", home=home)
    assert json.loads(p.stdout)["untrusted_orgs"] == [ORG]
    p = run_cli("--endpoint", hub.url, "stage", str(m), home=tmp_path / "trusted")
    assert p.returncode == 0 and "trusted kernel publisher" not in p.stderr, p.stderr


def test_serve_override_is_announced(untrusting_hub, home, tmp_path):
    m = write_manifest(tmp_path / "m.toml", {RELU: {"version": 1}}, [X86])
    assert run_cli("--endpoint", untrusting_hub.url, "stage", str(m), home=home).returncode == 0
    exe = str(Path(sys.executable).with_name("frt-mirror"))
    p = subprocess.run(
        ["timeout", "-s", "INT", "10", exe, "--home", str(home), "serve", "--port", str(free_port()), "--trust", ORG],
        capture_output=True,
        text=True,
        env=cli_env(),
    )
    assert f"--trust {ORG}: answering trustedKernelPublisher=true" in p.stderr
    assert "operator override, not the upstream's word" in p.stderr


def test_an_org_never_seen_upstream_is_not_vouched_for(hub, home, tmp_path):
    m = write_manifest(tmp_path / "m.toml", {RELU: {"version": 1}}, [X86])
    assert run_cli("--endpoint", hub.url, "stage", str(m), home=home).returncode == 0
    with serving(home) as mirror:
        status, _, _ = raw_http(mirror.port, raw_request("GET", "/api/organizations/someone-else/overview"))
        assert status == 404
        assert _overview(mirror.port)[1]["trustedKernelPublisher"] is True  # the upstream's word


# -- 4. LOCAL_KERNELS with several versions staged ---------------------------------------------------


def test_env_never_chooses_a_version_for_the_caller(hub, home, tmp_path):
    """LOCAL_KERNELS holds one path per repo and kernels loads it whatever version it asks for. Before,
    env chose the highest staged version with a warning on stderr, and get_kernel(version=1) loaded v2."""
    # layernorm v1 depends on activation v2; the manifest asks for activation v1 too: both are staged.
    m = write_manifest(tmp_path / "m.toml", {LAYERNORM: {"version": 1}, ACTIVATION: {"version": 1}}, [X86])
    assert run_cli("--endpoint", hub.url, "stage", str(m), home=home).returncode == 0
    p = run_cli("env", "--target", X86, home=home)
    assert p.returncode == 1, p.stderr
    refused = [ln for ln in p.stderr.splitlines() if ACTIVATION in ln]
    assert len(refused) == 1 and refused[0].startswith(f"frt-mirror: refused: {ACTIVATION}: left out"), p.stderr
    assert all(w in refused[0] for w in (f"--version {ACTIVATION}=N", "export-cache", "serve", "v1, v2")), p.stderr
    assert LAYERNORM not in p.stderr  # one version staged: nothing to say
    assert f"{LAYERNORM}=" in p.stdout and f"{ACTIVATION}=" not in p.stdout  # the rest still exported
    doc = json.loads(run_cli("env", "--target", X86, "--format", "json", home=home).stdout)
    assert [r.split(":")[0] for r in doc["refused"]] == [ACTIVATION]
    assert [k["repo"] for k in doc["kernels"]] == [LAYERNORM]
    out = load_offline(  # inside unshare -n: with no path for it, kernels can only fail, never load v2
        f"""
        import kernels
        try:
            print(kernels.get_kernel({ACTIVATION!r}, version=1).REVISION_NOTE)
        except Exception as e:
            print("not loaded:", type(e).__name__)
    """,
        doc["env"],
    )
    assert out.stdout.startswith("not loaded:"), (out.stdout, out.stderr[-2000:])

    p = run_cli("env", "--target", X86, "--version", f"{ACTIVATION}=1", "--format", "json", home=home)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert not any(ACTIVATION in w for w in doc["warnings"])
    out = load_offline(
        f"""
        import kernels
        print(kernels.get_kernel({ACTIVATION!r}, version=1).REVISION_NOTE)
    """,
        doc["env"],
    )
    assert out.returncode == 0 and out.stdout.split() == ["cu-rebuild"], out.stderr  # v1's head, not v2

    for bad, says in ((f"{ACTIVATION}=7", "not staged"), ("nope", "expected REPO=N"), (f"{RELU}=1", "not staged")):
        p = run_cli("env", "--target", X86, "--version", bad, home=home)
        assert p.returncode == 2 and says in p.stderr and len(p.stderr.strip().splitlines()) == 1, (bad, p.stderr)


# -- the README's three hand-offs, on a box without torch, with no [trust] table ---------------------


def test_readme_handoffs_from_a_box_without_torch(hub, home, tmp_path):
    """Stage for a named cluster target without torch, bundle, import inside `unshare -n`, then each of
    the README's options 1-3 as written, each inside a network namespace with no route."""
    m = write_manifest(tmp_path / "cluster.toml", {ACTIVATION: {"version": 1}, RELU: {"version": 1}}, [X86])
    env = no_torch_env(tmp_path)
    assert run_cli_process("--endpoint", hub.url, "stage", str(m), home=home, env=env).returncode == 0
    assert run_cli_process("verify", home=home, env=env).returncode == 0
    tar = tmp_path / "kernels.tar"
    assert run_cli_process("bundle", str(tar), home=home, env=env).returncode == 0
    hub.stop()
    cluster = tmp_path / "srv-frt"
    script = tmp_path / "cluster.sh"
    script.write_text(
        textwrap.dedent(f"""\
        set -eu
        ip link set lo up   # a fresh network namespace: loopback only, no route anywhere
        export FRT_MIRROR_HOME={cluster}
        frt-mirror import {tar}
        load='import kernels; print(kernels.get_kernel("{ACTIVATION}", version=1).REVISION_NOTE)'
        # 1. LOCAL_KERNELS
        (eval "$(frt-mirror env --target {X86})"; python -c "$load")
        # 2. a Hub cache that works with HF_HUB_OFFLINE=1
        frt-mirror export-cache {tmp_path}/hf-cache --target {X86}
        HF_HUB_CACHE={tmp_path}/hf-cache HF_HUB_OFFLINE=1 python -c "$load"
        # 3. the mirror as a Hub endpoint
        frt-mirror serve --host 0.0.0.0 --port 8470 2>{tmp_path}/serve.log &
        for i in $(seq 100); do python -c 'import socket; socket.create_connection(("127.0.0.1", 8470))' \\
            2>/dev/null && break; sleep 0.1; done
        (eval "$(frt-mirror env --serve http://127.0.0.1:8470)"; HF_HOME={tmp_path}/hf python -c "$load")
        kill %1
    """)
    )
    bin_dir = str(Path(sys.executable).parent)
    run_env = {k: v for k, v in cli_env().items() if k not in ("HF_HUB_DISABLE_XET",)}
    run_env["PATH"] = f"{bin_dir}:{run_env.get('PATH', '/usr/bin:/bin')}"
    p = subprocess.run([*NO_NET, "bash", str(script)], capture_output=True, text=True, env=run_env, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr + (tmp_path / "serve.log").read_text()
    assert p.stdout.splitlines().count("cu-rebuild") == 3, p.stdout  # v1's head, by each of the three
