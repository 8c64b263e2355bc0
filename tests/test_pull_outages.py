"""Pull-through when the upstream is rate-limited or down, with unmodified clients in subprocesses
(also in the huggingface_hub 1.33 venv: marked hub1).

- The fake Hub with the real Hub's fixed 429 windows, one window longer than --upstream-timeout: a cold
  `kernels.get_kernel(version=1)` still succeeds on first use (serve holds the API request while the
  upstream's window runs out; huggingface_hub sets no timeout on API calls), and once the refresh has
  landed the next request sees it, never a failure cached for the refs TTL.
- An upstream that refuses connections: a repo never pulled answers at once, 503 with Retry-After, saying
  unavailable.
"""

from __future__ import annotations

import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.fakehub import FakeHub, RateLimits
from tests.support.kernel_fixtures import ACTIVATION, ORG, RELU, demo_repos
from tests.support.serve_helpers import free_port, raw_http, raw_request, run_client, serve_env, serving

pytestmark = pytest.mark.hub1

# A cold get_kernel of activation costs the mirror 13 API calls upstream (overview, refs, two histories,
# nine listing pages): a quota of 8 puts a window's wait in the middle of the refresh, its window 11 s,
# past the mirror's 5 s --upstream-timeout.
LIMITS = RateLimits(api=8, resolvers=3000, window=11)
GET_V1 = f"""
    import kernels
    k = kernels.get_kernel("{ACTIVATION}", version=1)
    report(k.VERSION)
"""


def samples(port: int) -> dict:
    _, _, body = raw_http(port, raw_request("GET", "/metrics"))
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(body.decode())
        for s in fam.samples
    }


def test_get_kernel_succeeds_on_first_use_through_a_rate_limit_window_longer_than_the_timeout(tmp_path):
    with FakeHub(demo_repos(), trusted_orgs=[ORG], page_size=5, redirects=True, rate_limits=LIMITS) as hub:
        with serving(
            tmp_path / "home", "--upstream", hub.url, "--allow", ORG, "--upstream-timeout", "5", env=serve_env()
        ) as m:
            t0 = time.monotonic()
            p, out = run_client(GET_V1, m.url, tmp_path / "hf")  # the client's own defaults
            took = time.monotonic() - t0
            assert out == 1, p.stderr[-3000:]
            api = [e for e in hub.request_log if e.path.startswith("/api/") and "/resolve-cache/" not in e.path]
            # it did meet a window longer than the timeout (waited for, not run into: issue 43)
            assert len(api) > LIMITS.api and took > 5, (len(api), took)
            # The refresh has landed: the next answer is fresh (no X-Mirror-Stale), not a cached failure.
            status, headers, _ = raw_http(m.port, raw_request("GET", f"/api/kernels/{ACTIVATION}/refs"))
            assert status == 200 and "x-mirror-stale" not in headers, (status, headers)


def test_a_head_meeting_a_spent_window_gets_503_with_retry_after_then_the_refresh_is_what_it_sees(tmp_path):
    with FakeHub(
        demo_repos(),
        trusted_orgs=[ORG],
        page_size=5,
        redirects=True,
        rate_limits=RateLimits(api=2, resolvers=3000, window=11),
    ) as hub:
        with serving(
            tmp_path / "home", "--upstream", hub.url, "--allow", ORG, "--upstream-timeout", "2", env=serve_env()
        ) as m:
            url = f"/kernels/{RELU}/resolve/v1/build/torch-universal/metadata.json"
            t0 = time.monotonic()
            status, headers, _ = raw_http(m.port, raw_request("HEAD", url), timeout=30)
            assert status == 503 and int(headers["retry-after"]) >= 1, (status, headers)
            assert time.monotonic() - t0 < 6  # a HEAD waits --upstream-timeout, not the window
            # The refresh goes on behind the 503; once it lands (the window reset) the HEAD is answered.
            deadline = time.monotonic() + 40
            while (status := raw_http(m.port, raw_request("HEAD", url), timeout=30)[0]) != 200:
                assert status == 503 and time.monotonic() < deadline, status
                time.sleep(0.5)


def test_an_upstream_refusing_connections_is_unavailable_at_once(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there: every connection is refused
    env = {k: v for k, v in serve_env().items() if not k.startswith("FRT_RETRY")}  # the default retries
    with serving(tmp_path / "home", "--upstream", dead, "--allow", ORG, env=env) as m:
        for repo in (RELU, ACTIVATION):
            t0 = time.monotonic()
            status, headers, _ = raw_http(m.port, raw_request("GET", f"/api/kernels/{repo}/refs"))
            took = time.monotonic() - t0
            assert status == 503 and took < 1, (status, took)  # retryable, at once: not after the hold
            assert "unavailable" in headers["x-error-message"] and "within" not in headers["x-error-message"]
            assert headers["retry-after"] == "5", headers  # --upstream-timeout's default (no window known)
        counted = samples(m.port)
        assert counted.get(("frt_mirror_pull_seconds_count", (("kind", "refs"), ("outcome", "unavailable"))), 0) >= 2
        assert ("frt_mirror_pull_seconds_count", (("kind", "refs"), ("outcome", "timeout"))) not in counted
