"""Issue 43: pull-through inside the upstream's quota (8 `/api/` requests and 16 file requests per 10 s).
64 cold clients over 20 different files of `drift` (tests/support/quota.py), each asking what a client
asks: the revision (an API call, waiting up to --upstream-hold), then its file. A 503 says when to come
back (Retry-After), and a client comes back then, as huggingface_hub does for a GET. Counted: failed
requests and wrong bytes (0), every wait within the hold, and what the upstream was asked: each answer
once, each file once (the clients' misses coalesced), at most one 429 per window."""

from __future__ import annotations

import hashlib
import math
import threading
import time
import urllib.error
import urllib.request
from collections import Counter

import pytest

from tests.support.fakehub.ratelimit import RateLimits
from tests.support.quota import DRIFT, ORG, quota_hub
from tests.support.serve_helpers import raw_http, raw_request, serve_env, serving

pytestmark = pytest.mark.hub1

LIMITS = RateLimits(api=8, resolvers=16, window=10)
CLIENTS, FILES = 64, 20
HOLD = 60.0


def get(url: str, timeout: float = 90) -> tuple[int, dict[str, str], bytes, float]:
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read(), time.monotonic() - t0
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read(), time.monotonic() - t0


def wanted_files(hub) -> list[tuple[str, str, bytes]]:
    """(revision, path, bytes) of 20 files: the v1 and v2 heads' builds, as a cluster asks for them."""
    repo = hub.repos[("kernel", DRIFT)]
    out = []
    for rev in ("v1", "v2"):
        commit = repo.commits[repo.branches[rev]]
        out += [(rev, p, d) for p, d in sorted(commit.files.items()) if p.startswith("build/")][: FILES // 2]
    return out


def test_64_cold_clients_over_20_files_inside_the_quota(tmp_path):
    hub, _ = quota_hub(LIMITS)
    with hub:
        files = wanted_files(hub)
        args = ["--upstream", hub.url, "--allow", ORG, "--upstream-hold", str(HOLD), "--upstream-timeout", "5"]
        with serving(tmp_path / "home", *args, env=serve_env()) as m:
            failed: list[str] = []
            waits: list[float] = []
            lock = threading.Lock()

            def ask(url: str) -> tuple[int, bytes]:
                """One request, again after each 503 when Retry-After says."""
                while True:
                    status, headers, body, took = get(m.url + url)
                    with lock:
                        waits.append(took)
                    if status != 503 or "retry-after" not in headers:
                        return status, body
                    time.sleep(int(headers["retry-after"]))

            def client(i: int) -> None:
                rev, path, data = files[i % FILES]
                try:
                    status, body = ask(f"/api/kernels/{DRIFT}/revision/{rev}")
                    if status != 200:
                        failed.append(f"revision {rev}: {status} {body[:300]!r}")
                        return
                    status, body = ask(f"/kernels/{DRIFT}/resolve/{rev}/{path}")
                    if status != 200 or hashlib.sha256(body).digest() != hashlib.sha256(data).digest():
                        failed.append(f"{path}@{rev}: {status}, {len(body)} bytes {body[:300]!r}")
                except Exception as e:  # a client that could not finish is a failed request too
                    failed.append(f"{path}@{rev}: {e!r}")

            threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(300)
        log = hub.request_log
    assert failed == [], failed
    assert max(waits) <= HOLD + 5, max(waits)
    api = [r for r in log if r.path.startswith("/api/")]
    bodies = [r for r in log if "/resolve/" in r.path]
    for bucket, asked, quota in (("api", api, LIMITS.api), ("resolvers", bodies, LIMITS.resolvers)):
        answered = Counter(r.path for r in asked if r.status != 429)
        assert max(answered.values()) == 1, (bucket, answered.most_common(3))
        refused = sum(r.status == 429 for r in asked)
        assert refused <= math.ceil(len(answered) / quota), (bucket, refused)
    # The files the clients asked for, and each variant's metadata.json (the refresh reads them to record
    # its builds), each once, whoever asked.
    repo = hub.repos[("kernel", DRIFT)]
    heads = {rev: repo.branches[rev] for rev in ("v1", "v2")}
    expected = {f"/kernels/{DRIFT}/resolve/{heads[rev]}/{path}" for rev, path, _ in files}
    expected |= {
        f"/kernels/{DRIFT}/resolve/{sha}/{path}"
        for sha in heads.values()
        for path in repo.commits[sha].files
        if path.startswith("build/") and path.endswith("/metadata.json")
    }
    assert {r.path for r in bodies if r.status == 200} == expected
    assert len(api) > LIMITS.api, "the refresh needed more than a window's answers"


def test_past_the_hold_a_client_gets_503_with_retry_after_and_then_its_answer(tmp_path):
    hub, _ = quota_hub(RateLimits(api=4, resolvers=3000, window=10))
    with hub:
        args = ["--upstream", hub.url, "--allow", ORG, "--upstream-hold", "3", "--upstream-timeout", "2"]
        with serving(tmp_path / "home", *args, env=serve_env()) as m:
            url = f"/api/kernels/{DRIFT}/revision/v2"
            t0 = time.monotonic()
            status, headers, _ = raw_http(m.port, raw_request("GET", url), timeout=30)
            assert status == 503 and int(headers["retry-after"]) >= 1, (status, headers)
            assert time.monotonic() - t0 < 3 + 2, "an API request waits the hold, no more"
            deadline = time.monotonic() + 60
            while status == 503:
                assert time.monotonic() < deadline
                time.sleep(int(headers["retry-after"]))
                status, headers, _ = raw_http(m.port, raw_request("GET", url), timeout=30)
            assert status == 200, (status, headers)
