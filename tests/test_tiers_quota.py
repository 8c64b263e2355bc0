"""Issue 48: a quota at central (its own 429s, or a proxy's before it) is paced by the region as the Hub's
is. Central stages from the fake Hub and serves; a quota proxy before it (tests/support/quota_proxy.py)
allows 3 requests per bucket in 2 s windows and answers 429 past the quota, with the Hub's RateLimit
headers on every answer (as the Hub does), or on its 429s only (a plain limiter). The region pulls
through from the proxy, the cluster from the region. Unmodified clients at the cluster, concurrent,
asking for what the region does not have yet (files in threads, a snapshot, kernels' get_kernel), get
whole, correct files, or a 503 with Retry-After that their own retries ride through: never a 429, never
a 404. The proxy counts at most one refused request per window (resolver/pacing.py sends none it knows
will be refused; with headers on 429s only, each window's quota is learned from its one refused probe),
and the region's log and /metrics show the windows it waited for."""

from __future__ import annotations

import hashlib
import re
import threading

import pytest

from tests.support.fakehub.ratelimit import RateLimits
from tests.support.kernel_fixtures import ACTIVATION, LAYERNORM, RELU, X86_CPU
from tests.support.quota_proxy import QuotaProxy
from tests.support.serve_helpers import raw_http, raw_request, run_client, serving
from tests.support.tiers import MODEL, pull_through, stage_central

pytestmark = pytest.mark.hub1

LIMITS = RateLimits(api=3, resolvers=3, window=2)
ACCESS = re.compile(r'"(?:GET|HEAD|POST) (\S+) HTTP/1\.1" (\d{3}) ')

CLIENTS = """
    from concurrent.futures import ThreadPoolExecutor
    from huggingface_hub import hf_hub_download, snapshot_download

    def one(job):
        kind, repo, rev, path = job
        try:
            if kind == "file":
                return [repo, rev, path, sha256_of(hf_hub_download(repo, path, revision=rev, repo_type="kernel"))]
            return [repo, rev, path, tree_sha256(snapshot_download(repo, revision=rev))]
        except Exception as e:
            return [repo, rev, path, f"error {{type(e).__name__}}: {{e}}"]

    with ThreadPoolExecutor(6) as pool:
        report(list(pool.map(one, {jobs!r})))
"""

GET_KERNEL = f"""
    import kernels
    k = kernels.get_kernel("{LAYERNORM}", version=1)
    report([k.VERSION, k.VARIANT])
"""


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def answered(log: str) -> list[tuple[str, int]]:
    """(path, status) of each request in a serve's access log, but serving()'s readiness probe's."""
    return [(m[1], int(m[2])) for m in ACCESS.finditer(log) if m[1] != "/api/agent-harnesses"]


@pytest.mark.parametrize("announce", [True, False], ids=["headers-always", "headers-on-429"])
def test_a_quota_at_central_is_paced_by_the_region(tmp_path, announce):
    central_home, _, repos = stage_central(tmp_path)
    want: dict[tuple[str, str, str], object] = {}
    for repo, rev in ((RELU, "v1"), (ACTIVATION, "v1"), (ACTIVATION, "v2")):
        r = repos[repo]
        for path, data in r.commits[r.branches[rev]].files.items():
            if data is not None and path.startswith(f"build/{X86_CPU}/"):
                want[(repo, rev, path)] = sha(data)
    model = repos[MODEL]
    want[(MODEL, "main", "*")] = {p: sha(d) for p, d in model.commits[model.branches["main"]].files.items() if d}
    jobs = [("file" if path != "*" else "snapshot", *key) for key in want for path in [key[2]]]
    loaded: list[object] = []
    with (
        serving(central_home) as central,
        QuotaProxy(central.url, LIMITS, announce) as proxy,
        pull_through(tmp_path / "region", proxy.url) as region,
        pull_through(tmp_path / "cluster", region.url) as cluster,
    ):
        kernel = threading.Thread(
            target=lambda: loaded.append(
                run_client(GET_KERNEL, cluster.url, tmp_path / "hf-k", timeout=300, HF_HUB_ETAG_TIMEOUT="60")
            )
        )
        kernel.start()
        p, out = run_client(CLIENTS.format(jobs=jobs), cluster.url, tmp_path / "hf", timeout=300)
        kernel.join(300)
        assert out is not None, p.stderr[-3000:]
        got = {(repo, rev, path): digest for repo, rev, path, digest in out}
        snap = got.pop((MODEL, "main", "*"))
        assert isinstance(snap, dict), snap
        got[(MODEL, "main", "*")] = {k: v for k, v in snap.items() if not k.startswith(".cache")}
        assert got == want
        [(kp, kout)] = loaded
        assert kout == [1, X86_CPU], kp.stderr[-3000:]
        _, _, metrics = raw_http(region.port, raw_request("GET", "/metrics"), timeout=30)
        region_log, cluster_log = region.stderr(), cluster.stderr()
    # Never a 429 passed down, nor a 404 for what central has: each tier answered its clients 200, a
    # redirect, a 503 (with Retry-After: the access log does not show it, test_tiers does), or 204 (the
    # cluster handing its demand counts up).
    for tier, log in (("region", region_log), ("cluster", cluster_log)):
        statuses = {s for _, s in answered(log)}
        assert statuses <= {200, 204, 302, 307, 503}, (tier, [a for a in answered(log) if a[1] in (404, 429)])
    # The region kept to the quota: at most one refused request a window, in a run that needed several.
    windows = {b: proxy.per_window(b) for b in ("api", "resolvers")}
    for bucket, per in windows.items():
        after = sorted(w for w, c in per.items() if c["refused"])[1:] if not announce else sorted(per)
        # Headers on a 429 only: until the run's first 429 the region cannot know the upstream is
        # limited (pacing.py: answers without RateLimit are not paced), so what was already on its way
        # in that window may be refused too; from the next window on, one probe a window at most.
        assert all(per[w]["refused"] <= 1 for w in after), (bucket, per)
        assert announce or sum(c["refused"] for c in per.values()) >= 1, (bucket, per)  # its own 429s, met
    assert len(windows["api"]) >= 3 and len(windows["resolvers"]) >= 3, windows
    # ... and said so: a log line per window it waited for, and the count on /metrics.
    waits = re.findall(r"pull-through: waiting \d+ s for the upstream's (\w+) window \(3 per 2 s\)", region_log)
    assert {"api", "resolvers"} <= set(waits), region_log[-3000:]
    counted = dict(re.findall(rb'frt_mirror_upstream_waits_total\{bucket="(\w+)"\} (\d+)', metrics))
    assert int(counted[b"api"]) >= 1 and int(counted[b"resolvers"]) >= 1, counted
