"""An A100 (8.0) + H100 (9.0) fleet: targets that name their GPU archs, judged by kernels' own arch rule.

kernels 0.17.2 picks a variant by name and only then checks the build's metadata.json `backend.archs`
against the device, raising rather than trying the next variant. `hopper` (tests/support/kernel_fixtures.py)
rebuilt its v1 head for 9.0 only and has no fallback: refused for the fleet, pointing at the older
commit that covered 8.0. `hopper-fb` builds 9.0 beside a noarch `torch-cuda`: the fleet gets the
fallback. The load proofs run an unmodified `kernels.get_kernel` in a subprocess on this CPU box
standing in for an A100 node: only the device is faked, as kernels' own tests fake it.
"""

from __future__ import annotations

import json

import pytest

from frt.resolver.errors import BadInput
from frt.resolver.targets import parse_target
from tests.support.cli import cli_env, run_cli, write_manifest
from tests.support.fakehub import FakeHub
from tests.support.kernel_fixtures import H100_CU, ORG, fleet_repos
from tests.support.offline import load_offline
from tests.support.serve_helpers import raw_http, raw_request, run_client, serving

HOPPER, HOPPER_FB = f"{ORG}/hopper", f"{ORG}/hopper-fb"
CU = "torch2.13-cu130-x86_64-linux"  # this box's torch, so a faked CUDA device can load what is staged
FLEET, A100, H100 = f"{CU}@8.0,9.0", f"{CU}@8.0", f"{CU}@9.0"

# kernels' tests/test_archs.py `fake_cuda_device`: a CUDA build of torch and a device of capability 8.0.
FAKE_A100 = """
import torch
torch.version.cuda = "13.0"
torch.version.hip = None
torch.cuda.is_available = lambda: True
torch.cuda.get_device_capability = lambda device=None: (8, 0)
"""
LOAD = (
    FAKE_A100
    + f"""
import kernels
try:
    k = kernels.get_kernel({HOPPER_FB!r}, version=1)
    print(f"loaded {{k.VARIANT}}")
except RuntimeError as e:
    print(f"raised {{e}}")
"""
)


@pytest.fixture
def hub():
    with FakeHub(fleet_repos(), trusted_orgs=[ORG], page_size=5) as h:
        yield h


def resolve_json(hub, home, repo, target):
    p = run_cli("--endpoint", hub.url, "resolve", repo, "--version", "1", "--target", target, "--json", home=home)
    return p, json.loads(p.stdout)


def test_arch_targets_parse_canonically_and_refuse_what_kernels_never_checks():
    t = parse_target(f"{CU}@9.0,8.0,9.0")
    assert (t.archs, str(t), t.by_name) == (("8.0", "9.0"), FLEET, parse_target(CU))
    assert parse_target(str(t)) == t
    assert (
        str(parse_target("torch2.13-rocm71-x86_64-linux@gfx942,gfx90a:sramecc+:xnack-"))
        == "torch2.13-rocm71-x86_64-linux@gfx90a,gfx942"
    )
    for bad, why in [
        (f"{CU}@sm_80", "compute capability"),
        (f"{CU}@9.0a", "compute capability"),
        (f"{CU}@", "compute capability"),
        ("torch2.13-cpu-x86_64-linux@8.0", "no GPU archs"),
        ("torch2.13-rocm71-x86_64-linux@8.0", "gfx name"),
    ]:
        with pytest.raises(BadInput, match=why):
            parse_target(bad)


def test_the_fleet_is_refused_a_hopper_only_build_with_what_each_build_declares(hub, home):
    p, doc = resolve_json(hub, home, HOPPER, FLEET)
    assert p.returncode == 1, p.stderr
    refusal = doc
    repo = hub.repos[("kernel", HOPPER)]
    head, first = repo.branches["v1"], repo.commits[repo.branches["v1"]].parents[0]
    assert doc["error"] == "NoVariantForArchs" and doc["target_archs"] == ["8.0", "9.0"]
    assert doc["declared_archs"] == {H100_CU: ["9.0"]}
    assert doc["newest_commit_with_target"] == first
    assert f"has {H100_CU} (archs 9.0)" in doc["message"]
    assert (
        "CUDA capability 8.0 is not supported by the architectures of the build: 9.0" in doc["message"]
        and f"newest commit on v1 with it: {first[:12]}" in doc["message"]
    )
    # The H100s alone, and a target naming no archs, take the build kernels picks by name.
    for target in (H100, CU):
        p, doc = resolve_json(hub, home, HOPPER, target)
        assert p.returncode == 0 and (doc["commit"], doc["variant"]) == (head, H100_CU), p.stderr
    # Recorded verbatim, under the arch target's own name.
    p = run_cli("report", "--json", home=home)
    rows = [r for r in json.loads(p.stdout) if r["target"] == FLEET]
    assert len(rows) == 1 and rows[0]["error"] == "NoVariantForArchs" and rows[0]["target_archs"] == ["8.0", "9.0"]
    assert rows[0]["message"] == refusal["message"]
    assert (
        rows[0]["detail"] == f"{H100_CU}: CUDA capability 8.0 is not supported by the architectures of the build: 9.0"
    )


def test_the_fleet_takes_the_noarch_fallback_in_kernels_order(hub, home):
    p, doc = resolve_json(hub, home, HOPPER_FB, FLEET)
    assert p.returncode == 0 and doc["variant"] == "torch-cuda" and doc["archs"] is None, p.stderr
    _, doc = resolve_json(hub, home, HOPPER_FB, H100)
    assert doc["variant"] == H100_CU and doc["archs"] == ["9.0"]


def test_stage_from_a_manifest_with_archs_fetches_only_what_loads(hub, home, tmp_path):
    m = tmp_path / "fleet.toml"
    m.write_text(
        f'[[targets]]\nname = "a100-h100"\ntorch = "2.13"\nbackend = "cu130"\ncpu = "x86_64"\nos = "linux"\n'
        f'archs = ["8.0", "9.0"]\n\n[kernels]\n"{HOPPER}" = {{ version = 1 }}\n"{HOPPER_FB}" = {{ version = 1 }}\n'
    )
    p = run_cli("--endpoint", hub.url, "stage", str(m), "--json", home=home)
    assert p.returncode == 1, p.stderr  # hopper is refused
    rows = {r["repo"]: r for r in json.loads(p.stdout)["rows"]}
    assert {r["target"] for r in rows.values()} == {FLEET}
    assert rows[HOPPER]["status"] == "refused" and "archs 9.0" in rows[HOPPER]["detail"]
    assert (rows[HOPPER_FB]["status"], rows[HOPPER_FB]["variant"]) == ("staged", "torch-cuda")
    fetched = [path for method, path, _ in hub.requests if method == "GET" and "/resolve/" in path]
    assert not [f for f in fetched if H100_CU in f and not f.endswith("metadata.json")], fetched


def test_matrix_shows_archs_per_variant_and_target(hub, home):
    resolve_json(hub, home, HOPPER_FB, FLEET)  # scans it
    resolve_json(hub, home, HOPPER, FLEET)
    p = run_cli("matrix", HOPPER_FB, "--target", FLEET, "--target", H100, home=home)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[3].split()[-2:] == ["fb", "ok"], p.stdout
    assert f"   2  {H100_CU}  archs 9.0" in lines and "   1  torch-cuda  no archs" in lines
    assert f"  T1  {FLEET}" in lines and "fb = served by a build that loads on every arch" in p.stdout
    doc = json.loads(run_cli("matrix", HOPPER_FB, "--target", FLEET, "--json", home=home).stdout)
    assert doc["target_archs"] == {FLEET: ["8.0", "9.0"]}
    rev = doc["revisions"][0]
    assert rev["archs"] == {H100_CU: ["9.0"], "torch-cuda": None}
    assert (rev["serves"], rev["by_name"]) == ({FLEET: "torch-cuda"}, {FLEET: H100_CU})
    doc = json.loads(run_cli("matrix", HOPPER, "--target", FLEET, "--json", home=home).stdout)
    assert [r["serves"][FLEET] for r in doc["revisions"]] == [None, H100_CU]  # the head refused, its parent not


def test_the_page_shows_archs_and_the_fallback(hub, home, tmp_path):
    resolve_json(hub, home, HOPPER_FB, FLEET)
    page = tmp_path / "m.html"
    p = run_cli("matrix", HOPPER_FB, "--target", FLEET, "--html", str(page), home=home)
    assert p.returncode == 0, p.stderr
    html = page.read_text()
    assert f"{H100_CU}: built, archs 9.0" in html and "torch-cuda: built, no archs" in html
    assert "@8.0,9.0" in html and f"kernels picks <code>{H100_CU}</code>" in html


@pytest.mark.parametrize("handoff", ["env", "export-cache"])
def test_a100_nodes_load_the_noarch_build_where_the_name_pick_raises(hub, home, tmp_path, handoff):
    """Staged for @8.0, an unmodified get_kernel on an A100 loads torch-cuda. Staged for the target
    without archs (what the mirror could say before), the same node raises: kernels' own check."""
    for target in (A100, CU):
        m = write_manifest(tmp_path / "m.toml", {HOPPER_FB: {"version": 1}}, [target])
        assert run_cli("--endpoint", hub.url, "stage", str(m), home=home).returncode == 0
    outcome = {}
    for target in (A100, CU):
        if handoff == "env":
            p = run_cli("env", "--target", target, "--format", "json", home=home)
            env = json.loads(p.stdout)["env"]
            assert env["LOCAL_KERNELS"].endswith("/build/" + ("torch-cuda" if target == A100 else H100_CU))
        else:
            cache = tmp_path / f"cache-{target}"
            p = run_cli("export-cache", str(cache), "--target", target, home=home)
            env = {"HF_HUB_CACHE": str(cache), "HF_HUB_DISABLE_XET": "1"}
            variants = {d.name for d in cache.glob("kernels--*/snapshots/*/build/*")}
            assert variants == {"torch-cuda" if target == A100 else H100_CU}
        assert p.returncode == 0, p.stderr
        out = load_offline(LOAD, env)
        assert out.returncode == 0, out.stderr
        outcome[target] = out.stdout.strip()
    assert outcome[A100] == "loaded torch-cuda"
    assert outcome[CU].startswith(
        f"raised Kernel 'hopper-fb' variant '{H100_CU}' does not support the current "
        "device: CUDA capability 8.0 of the current device is not supported"
    ), outcome


def test_serve_says_where_its_clients_would_pick_a_build_their_gpus_refuse(hub, home, tmp_path):
    """serve cannot know a client's GPU. Staged for the A100s alone, it lists only what loads there; staged
    for a target without archs too, it lists the 9.0 build, kernels on an A100 picks it by name and raises:
    serve's start-up line and the page say so, and point at env and export-cache."""
    code = LOAD.replace("print(", "report(")
    m = write_manifest(tmp_path / "m.toml", {HOPPER_FB: {"version": 1}}, [A100])
    assert run_cli("--endpoint", hub.url, "stage", str(m), home=home).returncode == 0
    with serving(home) as served:
        assert "warning" not in served.stderr()
        p, said = run_client(code, served.url, tmp_path / "hf-1")
        assert said == "loaded torch-cuda", p.stderr
    m = write_manifest(tmp_path / "m.toml", {HOPPER_FB: {"version": 1}}, [CU])
    assert run_cli("--endpoint", hub.url, "stage", str(m), home=home).returncode == 0
    with serving(home) as served:
        warning = [ln for ln in served.stderr().splitlines() if "warning" in ln]
        assert len(warning) == 1 and f"kernels on {A100} picks {H100_CU} by name (archs 9.0)" in warning[0]
        assert f"'frt-mirror env --target {A100}'" in warning[0] and "which give them torch-cuda" in warning[0]
        p, said = run_client(code, served.url, tmp_path / "hf-2")
        assert said.startswith("raised") and "CUDA capability 8.0" in said, p.stderr
        status, _, body = raw_http(served.port, raw_request("GET", "/"))
        assert status == 200 and "their GPUs refuse" in body.decode() and "by name (archs 9.0)" in body.decode()


def test_manifest_archs_errors_point_at_the_line(home, tmp_path):
    m = tmp_path / "bad.toml"
    for archs, why in [("[8.0, 9.0]", "quoted arch names"), ('["sm_80"]', "compute capability")]:
        m.write_text(f'[[targets]]\ntarget = "{CU}"\narchs = {archs}\n\n[kernels]\n"{HOPPER}" = {{ version = 1 }}\n')
        p = run_cli("stage", str(m), home=home, env=cli_env())
        assert p.returncode == 2 and why in p.stderr and "bad.toml" in p.stderr, p.stderr
        assert len(p.stderr.strip().splitlines()) == 1
