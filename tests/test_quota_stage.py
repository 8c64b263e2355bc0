"""Issue 43: `stage` inside the upstream's quota. Against 8 `/api/` requests per 10 s (the real Hub's
RateLimit headers on every answer, 429 past the quota) a two-kernel manifest whose scan needs about six
windows of API answers (tests/support/quota.py): it never finished (each listing page asked again after
every 429 window, exit 3 after 120 s). Now, at 1, 8 (the default) and 16 jobs: each distinct answer is
fetched once, a request is sent again only after a 429, at most one 429 per window, and the whole stage
takes at most 1.15 x the quota's floor (ceil(answers / 8) windows, plus the run without a quota)."""

from __future__ import annotations

import math
import time
from collections import Counter

import pytest

from tests.support.cli import X86, run_cli, stage_json
from tests.support.fakehub.wire import LoggedRequest
from tests.support.quota import TIGHT, quota_hub, quota_manifest


def api_requests(log: list[LoggedRequest]) -> list[LoggedRequest]:
    """The requests the api bucket counts (not the files' /resolve/ and /api/resolve-cache/)."""
    return [r for r in log if r.path.startswith("/api/") and not r.path.startswith("/api/resolve-cache/")]


@pytest.fixture(scope="module")
def unlimited(tmp_path_factory):
    """The same stage without a quota: the distinct API answers it needs, and its wall time."""
    d = tmp_path_factory.mktemp("unlimited")
    hub, pins = quota_hub(limits=None)
    with hub:
        t0 = time.monotonic()
        p, _ = stage_json(d / "home", quota_manifest(d / "m.toml", pins, X86), hub)
        wall = time.monotonic() - t0
        api = api_requests(hub.request_log)
    assert p.returncode == 0, p.stderr
    answers = {(r.method, r.path) for r in api}
    assert len(answers) == len(api) > 4 * TIGHT.api, "the scan must need more answers than several windows hold"
    return len(answers), wall


@pytest.mark.parametrize("jobs", [1, pytest.param(8, marks=pytest.mark.hub1), 16])
def test_stage_under_a_tight_quota_fetches_each_answer_once_and_ends_at_the_quotas_pace(jobs, unlimited, tmp_path):
    needed, unlimited_wall = unlimited
    hub, pins = quota_hub()
    manifest = quota_manifest(tmp_path / "m.toml", pins, X86)
    with hub:
        t0 = time.monotonic()
        p, doc = stage_json(tmp_path / "home", manifest, hub, "--jobs", str(jobs))
        wall = time.monotonic() - t0
        api = api_requests(hub.request_log)
    assert p.returncode == 0, p.stderr
    assert {r["status"] for r in doc["rows"]} == {"staged"} and len(doc["rows"]) == 6
    refused = sum(r.status == 429 for r in api)
    answered = Counter((r.method, r.path) for r in api if r.status != 429)
    assert max(answered.values()) == 1, answered.most_common(3)
    assert len(answered) == needed, "exactly the answers the stage needs without a quota"
    assert len(api) == needed + refused, "a request is sent again only after its 429"
    windows = math.ceil(needed / TIGHT.api)
    assert refused <= windows, "at most one 429 per window"
    floor = windows * TIGHT.window + unlimited_wall
    assert wall <= 1.15 * floor, (wall, floor)
    waits = [ln for ln in p.stderr.splitlines() if ln.startswith("frt-mirror: waiting ")]
    assert 1 <= len(waits) <= windows, p.stderr
    assert run_cli("verify", home=tmp_path / "home").returncode == 0
