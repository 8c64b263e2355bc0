"""The fleet's demand (issue 30): serve counts what unmodified kernels clients ask for, by the target their
User-Agent names, and what it could not answer; `report --demand` lists it, `demand manifest` turns the
misses into a manifest for the connected box, and the loop closes through an incremental bundle.

The cluster side runs inside `unshare -n` (loopback only): serve, the clients, report, import. The
connected box stages from the fake Hub. The page after the loop is kept as a PNG (build/test-artifacts).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.browser import chromium, png_size
from tests.support.cli import X86, cli_env, run_cli, write_manifest
from tests.support.fakehub import FakeHub
from tests.support.kernel_fixtures import ACTIVATION, ORG, demo_repos
from tests.support.offline import NO_NET
from tests.support.serve_helpers import serving

X86_CU = "torch2.11-cu130-x86_64-linux"  # what the cluster staged; its CPU nodes ask for X86
ARTIFACTS = Path(__file__).resolve().parents[1] / "build" / "test-artifacts"


def cluster(tmp: Path, name: str, home: Path, tar: Path, after: str) -> subprocess.CompletedProcess:
    """In a network namespace with no route: import `tar`, serve the home, load activation v1 and v2 with
    unmodified kernels through HF_ENDPOINT, stop serve, then run `after` (report, demand manifest)."""
    script = tmp / f"{name}.sh"
    script.write_text(
        textwrap.dedent(f"""\
        set -u
        ip link set lo up
        export FRT_MIRROR_HOME={home}
        frt-mirror import {tar} || exit 9
        frt-mirror serve --port 8470 2>{tmp}/{name}-serve.log &
        for i in $(seq 150); do python -c 'import socket; socket.create_connection(("127.0.0.1", 8470))' \\
            2>/dev/null && break; sleep 0.1; done
        for v in 1 2; do
          HF_ENDPOINT=http://127.0.0.1:8470 HF_HOME={tmp}/{name}-hf python -c \\
            "import kernels; print('loaded v$v', kernels.get_kernel('{ACTIVATION}', version=$v).REVISION_NOTE)" \\
            2>{tmp}/{name}-client-v$v.err || echo "refused v$v"
        done
        kill %1; wait   # serve writes its counts as it stops
        {after}
    """)
    )
    env = cli_env()
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    return subprocess.run([*NO_NET, "bash", str(script)], capture_output=True, text=True, env=env, timeout=400)


@pytest.mark.hub1
def test_the_demand_loop_from_a_cluster_miss_to_a_load(tmp_path):
    conn, site = tmp_path / "connected", tmp_path / "cluster"
    with FakeHub(demo_repos(), trusted_orgs=[ORG]) as hub:
        m = write_manifest(tmp_path / "cluster.toml", {ACTIVATION: {"version": 1}}, [X86_CU])
        assert run_cli("--endpoint", hub.url, "stage", str(m), home=conn).returncode == 0
        full = tmp_path / "full.tar"
        assert run_cli("bundle", str(full), home=conn).returncode == 0

        # On the cluster, CPU nodes ask for activation v1 (staged for CUDA only) and v2 (not staged).
        first = cluster(
            tmp_path,
            "first",
            site,
            full,
            f"frt-mirror report --demand > {tmp_path}/report.txt; "
            f"frt-mirror report --demand --json > {tmp_path}/demand.json; "
            f"frt-mirror demand manifest > {tmp_path}/more.toml",
        )
        out = first.stdout + first.stderr
        assert first.returncode == 0, out + (tmp_path / "first-serve.log").read_text()
        assert "refused v1" in first.stdout and "refused v2" in first.stdout, out
        # the client is told why, in the 404's message: the version is known, not staged
        v2_err = (tmp_path / "first-client-v2.err").read_text()
        assert "not staged" in v2_err and "report --demand" in v2_err, v2_err[-3000:]
        (line,) = [d for d in json.loads((tmp_path / "demand.json").read_text()) if d["repo"] == ACTIVATION]
        assert line["target"] == X86, line
        misses = {(x["asked"], x["outcome"]) for x in line["misses"]}
        assert misses == {("v1", "variant"), ("v2", "version")}, line
        assert not any(x["staged_since"] for x in line["misses"])
        report = (tmp_path / "report.txt").read_text()
        assert "v2: not staged here" in report and "v1: no build staged for this target" in report, report
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        (ARTIFACTS / "report-demand.txt").write_text(report)
        manifest = (tmp_path / "more.toml").read_text()
        assert f'target = "{X86}"' in manifest and "{ version = 1 }, { version = 2 }" in manifest, manifest

        # The connected box stages the misses and sends only what is new.
        p = run_cli("--endpoint", hub.url, "stage", str(tmp_path / "more.toml"), home=conn)
        assert p.returncode == 0, p.stderr
        inc = tmp_path / "more.tar"
        assert run_cli("bundle", str(inc), "--since", str(full), home=conn).returncode == 0

    second = cluster(tmp_path, "second", site, inc, f"frt-mirror report --demand --json > {tmp_path}/demand2.json")
    assert second.returncode == 0, second.stdout + second.stderr
    loaded = sorted(ln for ln in second.stdout.splitlines() if ln.startswith("loaded"))
    assert loaded == ["loaded v1 cu-rebuild", "loaded v2 v2.1"], second.stdout + second.stderr
    (line,) = [d for d in json.loads((tmp_path / "demand2.json").read_text()) if d["repo"] == ACTIVATION]
    assert all(x["staged_since"] for x in line["misses"]) and len(line["served"]) == 2, line
    assert run_cli("demand", "manifest", home=site).stdout == ""  # nothing left to ask for

    # The page after the loop, in a real browser: the card names what was asked for and that it is staged now.
    shot = ARTIFACTS / "page-after-the-demand-loop.png"
    with serving(site) as s:
        p = chromium(tmp_path, f"--screenshot={shot}", "--window-size=1400,1600", s.url + "/")
        assert p.returncode == 0 and shot.exists(), p.stderr[-2000:]
        dom = chromium(tmp_path, "--dump-dom", s.url + "/").stdout
    assert png_size(shot) == (1400, 1600)
    assert "Asked for by the fleet" in dom and "staged since" in dom, dom[:3000]


def test_a_kernels_user_agent_names_its_target():
    from frt.mirror.serve.demand import target_of

    real = (
        "kernels/0.17.2; hf_hub/2.4.0; python/3.11.7; torch/2.13.0+cpu; kernels/0.17.2; python/3.11; "
        "backend/cu130; platform/x86_64-linux; file_type/kernel; torch/2.11.0; glibc/2.36"
    )
    assert target_of(real) == "torch2.11-cu130-x86_64-linux"
    assert target_of("kernels/0.17.2; backend/cpu; platform/aarch64-darwin") == "notorch-cpu-aarch64-darwin"
    assert target_of("kernels/0.17.2; backend/cu9; platform/x86_64-linux; torch/2.11.0") == ""  # not a target
    assert target_of("huggingface_hub/2.4.0; python/3.11") is None  # not kernels: not counted


AGENT = "kernels/0.17.2; python/3.11; backend/cpu; platform/x86_64-linux; file_type/kernel; torch/2.13.0+cpu"


def _scope(agent: str = AGENT, client: str = "10.1.2.3") -> dict:
    return {"headers": [(b"user-agent", agent.encode())], "client": (client, 40000)}


def test_counts_wait_for_a_ledger_that_is_down_and_stay_bounded(monkeypatch):
    """The counts are the ledger's only in a write every few seconds: while it fails they are kept (and
    added to), then written whole; past MAX_DAILY kinds of request a day a process counts no new kind."""
    from frt.mirror.serve import demand
    from frt.mirror.serve.catalog import ServedRepo

    monkeypatch.setattr(demand, "INTERVAL", 3600.0)  # this test writes by hand
    monkeypatch.setattr(demand, "MAX_DAILY", 4)
    written: list[dict] = []
    down = [True]

    def write(tallies):
        if down[0]:
            raise OSError("the ledger's server is down")
        written.append(dict(tallies))

    rec = demand.DemandRecorder(write)
    repo = ServedRepo("acme/relu", "kernel", branches={"v1": "a" * 40}, unstaged={"v2": "b" * 40})
    for _ in range(3):
        rec.listed(_scope(), repo, "a" * 40, "a" * 40, ["torch-cpu", "torch-cuda"])
        rec.missed(_scope(), repo, "b" * 40)
    assert rec.flush() is False  # kept
    rec.listed(_scope(), repo, "v1", "a" * 40, ["torch-cpu"])
    rec.listed(_scope("huggingface_hub/2.4.0; python/3.11"), repo, "v1", "a" * 40, ["torch-cpu"])  # not kernels
    rec.listed(_scope(), repo, "refs/heads/v1", "a" * 40, ["torch-cpu"])  # kernels' upgrade hint: no ask
    rec.missed(_scope(), repo, "refs/heads/v2")
    for n in range(5):  # two kinds so far, MAX_DAILY 4: two more repos counted, three dropped
        rec.missed_repo(_scope(), f"acme/other-{n}")
    rec.missed_repo(_scope(), "acme/../etc")  # not a repo id: nobody's demand
    down[0] = False
    assert rec.flush() is True
    (tallies,) = written
    counts = {(a.repo, a.asked, a.outcome, a.client): t.count for a, t in tallies.items()}
    assert counts == {
        ("acme/relu", "v1", "served", ""): 4,
        ("acme/relu", "v2", "version", ""): 3,
        ("acme/other-0", "", "repo", ""): 1,
        ("acme/other-1", "", "repo", ""): 1,
    }
    assert {t.variant for a, t in tallies.items() if a.outcome == "served"} == {"torch-cpu"}


def test_client_addresses_are_kept_only_when_asked():
    from frt.mirror.serve.demand import DemandRecorder

    for clients, want in ((False, ""), (True, "10.1.2.3")):
        got: list = []
        rec = DemandRecorder(got.append, clients=clients)
        rec.missed_repo(_scope(), "acme/relu")
        rec.flush()
        assert [a.client for a in got[0]] == [want]
