"""frt-mirror reaches only the upstream it is given. huggingface_hub (1.33 and 2.x) builds its
user agent by fetching an agent registry (`/api/agent-harnesses`) from its *global* endpoint, once per
process: huggingface.co, or HF_ENDPOINT, not the endpoint a client was made for. A pull-through
mirror on a fenced site stalled ~10 s on its first refresh, waiting on DNS for huggingface.co. Here
HF_ENDPOINT names a canary (a second fake Hub), so a fetch that went there would be seen."""

from __future__ import annotations

import pytest

from tests.support.cli import X86, cli_env, run_cli_process, stage_json, write_manifest
from tests.support.fakehub import FakeHub
from tests.support.kernel_fixtures import ORG, RELU, demo_repos
from tests.support.serve_helpers import raw_http, raw_request, serving

pytestmark = pytest.mark.hub1


def test_stage_asks_only_its_endpoint(tmp_path):
    with FakeHub(demo_repos(), trusted_orgs=[ORG]) as hub, FakeHub([]) as canary:
        manifest = write_manifest(tmp_path / "m.toml", {RELU: {"version": 1}}, [X86])
        # A process: huggingface_hub reads HF_ENDPOINT as it is imported, the endpoint this proves unasked.
        env = cli_env(HF_ENDPOINT=canary.url)
        p, doc = stage_json(tmp_path / "home", manifest, hub, env=env, run=run_cli_process)
        assert p.returncode == 0 and doc["downloaded_bytes"] > 0, p.stderr
        assert [e.path for e in canary.request_log] == []


def test_pull_through_asks_only_its_upstream(tmp_path):
    with FakeHub(demo_repos(), trusted_orgs=[ORG]) as hub, FakeHub([]) as canary:
        env = {**cli_env(HF_ENDPOINT=canary.url)}
        with serving(tmp_path / "home", "--upstream", hub.url, "--allow", ORG, env=env) as m:
            status, _, _ = raw_http(m.port, raw_request("GET", f"/api/kernels/{RELU}/refs"), timeout=60)
            assert status == 200
        assert [e.path for e in canary.request_log] == []
