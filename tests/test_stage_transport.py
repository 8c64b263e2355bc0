"""The stager against the real Hub's transport (the fake Hub's switches, judged by the real clients in
tests/test_fakehub_transport.py): 307s to the resolve cache, 302s to a CDN host with signed URLs that
expire, 429s with `RateLimit` over fixed windows, a stale `revision/main` after a force-push, and a
local disk that fails — which must be reported as that, never as the upstream refusing."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.support.cli import X86, cli_env, one_line, run_cli, stage_json, write_manifest
from tests.support.fakehub import FakeHub, FakeRepo
from tests.support.fakehub.ratelimit import RateLimits
from tests.support.kernel_fixtures import LAYERNORM, ORG, RELU, X86_CPU, blob, build, demo_repos

pytestmark = pytest.mark.hub1

BIG = f"{ORG}/big-lfs"


def big_repo() -> FakeRepo:
    """Files above the LFS threshold (so they take the CDN hop) and small ones (the 307 hop)."""
    repo = FakeRepo(BIG)
    extra = {f"_big_{i}.abi3.so": blob(f"lfs-{i}", 400_000 + 50_000 * i) for i in range(3)}
    repo.commit(build("big", [X86_CPU], version=1, note="big", extra=extra), title="big", branch="v1")
    return repo


@pytest.fixture
def real_hub():
    with FakeHub([*demo_repos(), big_repo()], trusted_orgs=[ORG], page_size=5, redirects=True) as h:
        yield h


@pytest.fixture
def manifest(tmp_path):
    return write_manifest(
        tmp_path / "m.toml", {BIG: {"version": 1}, LAYERNORM: {"version": 1}, RELU: {"version": 1}}, [X86]
    )


def test_stage_follows_both_redirects_and_verifies(real_hub, home, manifest):
    p, doc = stage_json(home, manifest, real_hub, env=cli_env(HF_TOKEN="hf_secret_for_the_hub_only"))
    assert p.returncode == 0, p.stderr
    assert doc["downloaded_bytes"] == doc["needed_bytes"] > 1_000_000
    log = real_hub.request_log
    cdn = [r for r in log if r.server == "cdn" and r.method == "GET"]
    assert len(cdn) >= 3 and len({r.path.split("?")[0] for r in cdn}) == len(cdn), "each LFS body, once"
    assert all("authorization" not in {k.lower() for k in r.headers} for r in cdn), "the token stays with the Hub"
    assert any(r.status == 307 for r in log) and any(r.status == 302 for r in log)
    assert any("/api/resolve-cache/" in r.path and r.status == 200 for r in log)
    assert run_cli("verify", home=home).returncode == 0


def test_an_expired_cdn_url_is_signed_again_by_asking_the_hub(real_hub, home, manifest):
    # Every URL the Hub signs is already expired, until the CDN has refused one: then they last.
    real_hub.cdn_url_ttl = -10.0

    def renew_after_first_refusal():
        while not any(r.server == "cdn" and r.status == 403 for r in real_hub.request_log):
            time.sleep(0.01)
        real_hub.cdn_url_ttl = 3600.0

    watcher = threading.Thread(target=renew_after_first_refusal, daemon=True)
    watcher.start()
    real_hub.faults.drop_after("_big_2", nbytes=200_000, times=1)  # and one body cut: resumed, re-signed
    p, doc = stage_json(home, manifest, real_hub)
    assert p.returncode == 0, p.stderr
    watcher.join(timeout=5)
    cdn = [r for r in real_hub.request_log if r.server == "cdn"]
    assert any(r.status == 403 for r in cdn), "the test must have made a URL expire"
    assert any(r.status == 206 for r in cdn), "the cut body was resumed with Range, through a fresh 302"
    assert doc["downloaded_bytes"] == doc["needed_bytes"], "resumed, not restarted"
    assert run_cli("verify", home=home).returncode == 0


def test_rate_limits_are_waited_out_not_failed(home, manifest):
    """Both buckets past their quota, over the Hub's transport (a 307 to the resolve cache is a resolver
    request too), with listings of several pages: every window is waited for, not run into. At most one
    429 per window and bucket (issue 43: the pacer reads RateLimit off every answer), none sent twice."""
    limits = RateLimits(api=10, resolvers=20, window=2)  # a stage needs ~30 API calls and ~90 resolver ones
    with FakeHub(
        [*demo_repos(), big_repo()], trusted_orgs=[ORG], page_size=5, redirects=True, rate_limits=limits
    ) as hub:
        t = time.monotonic()
        p, doc = stage_json(home, manifest, hub, env=cli_env(FRT_RETRY_ATTEMPTS="2"))
        took = time.monotonic() - t
        log = [r for r in hub.request_log if r.server != "cdn"]
    assert p.returncode == 0, p.stderr
    by_bucket = {"api": 0, "resolvers": 0}
    refused = {"api": 0, "resolvers": 0}
    for r in log:
        bucket = "resolvers" if "/resolve/" in r.path or "/api/resolve-cache/" in r.path else "api"
        by_bucket[bucket] += 1
        refused[bucket] += r.status == 429
    assert by_bucket["api"] > limits.api and by_bucket["resolvers"] > limits.resolvers, "the quotas must be met"
    for bucket, quota in (("api", limits.api), ("resolvers", limits.resolvers)):
        assert refused[bucket] <= -(-by_bucket[bucket] // quota), (bucket, refused, by_bucket)
    answered = [(r.method, r.path) for r in log if r.status != 429]
    assert len(answered) == len(set(answered)), "each answer once"
    assert took >= 2, "it waited for a window to reset"
    assert doc["downloaded_bytes"] == doc["needed_bytes"]
    assert run_cli("verify", home=home).returncode == 0


def test_a_stale_revision_main_after_a_force_push_does_not_derail_the_stage(real_hub, home, tmp_path):
    repo = real_hub.repos[("kernel", RELU)]
    repo.branch("rewrite", repo.branches["v1"])
    repo.commit(
        build("relu", ["torch-universal", X86_CPU], version=1, note="rewritten"), title="rewritten", branch="rewrite"
    )
    new_head = repo.branches.pop("rewrite")
    repo.force_push("main", new_head, stale_for=50)
    m = write_manifest(tmp_path / "m.toml", {RELU: {"revision": "main"}}, [X86])
    p, doc = stage_json(home, m, real_hub)
    assert p.returncode == 0, p.stderr
    assert [r["commit"] for r in doc["rows"]] == [new_head]


def test_a_cdn_that_refuses_every_signed_url_is_unavailable_after_a_bound(real_hub, home, manifest):
    """Every URL the Hub signs has expired: signed again MAX_RESIGNS times, then one line, exit 3."""
    from frt.mirror.stage.transport import MAX_RESIGNS

    real_hub.cdn_url_ttl = -10.0
    p = run_cli("--endpoint", real_hub.url, "stage", str(manifest), home=home)
    assert p.returncode == 3, p.stderr
    assert one_line(p).endswith(f": the CDN refused {MAX_RESIGNS + 1} freshly signed URLs"), p.stderr
    per_file = Counter(r.path.split("?")[0] for r in real_hub.request_log if r.server == "cdn" and r.status == 403)
    assert max(per_file.values()) == MAX_RESIGNS + 1, per_file  # each file: its bound, not forever


def test_a_file_its_own_listing_names_that_answers_404_is_refused_and_recorded(real_hub, home, manifest):
    """The upstream lists _big_1 at an immutable commit, then answers 404 for it: a refusal (exit 1,
    recorded as ListedFileMissing), not "try again later", and not retried. The other repos stage."""
    from frt.mirror.store.home import Home

    real_hub.faults.fail_next(100, status=404, match="_big_1")
    p, doc = stage_json(home, manifest, real_hub)
    assert p.returncode == 1, p.stderr
    refused = [r for r in doc["rows"] if r["status"] == "refused"]
    assert [r["repo"] for r in refused] == [BIG] and "the upstream lists this file" in refused[0]["detail"]
    assert "answers 404 for it" in refused[0]["detail"]
    assert [r.error for r in Home(home).ledger.refusals() if r.repo_id == BIG] == ["ListedFileMissing"]
    asked = [r for r in real_hub.request_log if "_big_1" in r.path and r.status == 404]
    assert len(asked) == 1, "a 404 for a listed file is an answer, not a transient failure"


def test_a_full_disk_is_a_local_error_not_an_upstream_refusal(real_hub, home, manifest, tmp_path):
    """The home on a 1 MiB tmpfs: the stage does not fit, which its check says before the first byte (or,
    with no room for the ledger, SQLite's write says first). A disk error either way (exit 4)."""
    if os.geteuid() != 0:
        pytest.fail("needs root for a tmpfs mount namespace (CI runs as root)")
    exe = str(Path(sys.executable).with_name("frt-mirror"))
    home.mkdir(parents=True)
    script = f"mount -t tmpfs -o size=1m tmpfs {home} && {exe} --home {home} --endpoint {real_hub.url} stage {manifest}"
    p = subprocess.run(
        ["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, env=cli_env(), timeout=120
    )
    assert p.returncode == 4, p.stderr
    lines = p.stderr.strip().splitlines()
    # The stage's own check, or the ledger's write if the scan already fills the disk (SQLite's own words).
    assert (
        len(lines) == 1
        and ("not enough disk space: needs " in lines[0] or "database or disk is full" in lines[0])
        and ("nothing fetched" in lines[0] or "a local disk error" in lines[0])
    ), p.stderr
    assert "upstream" not in lines[0] and "refused" not in lines[0], lines[0]


def test_a_full_disk_at_the_parts_move_into_the_store_removes_that_part(real_hub, home, manifest, monkeypatch):
    """ENOSPC from the last step of a verified download (the part's fsync or its shard folder's mkdir on a
    full disk) stops the stage with a disk error and leaves no .part behind. Injected in this process:
    which of a tmpfs's writes fails first is not something a test can choose, so the store's move is made
    to fail as a full disk fails it."""
    import errno

    from frt.mirror.store.files import FileBlobStore

    def full(self, part, digest):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(FileBlobStore, "_move_in", full)
    p = run_cli("--endpoint", real_hub.url, "stage", str(manifest), home=home)
    assert p.returncode == 4, p.stderr
    line = one_line(p)
    assert "into the store: No space left on device (a local disk error)" in line, line
    assert not any((home / "tmp").glob("*.part")), "the parts the disk refused are removed"
