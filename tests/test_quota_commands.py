"""Issue 43: every command that lists the upstream goes through the same paced path, each under the tight
quota (8 `/api/` requests per 10 s, tests/support/quota.py): `scan`, `resolve`, `bisect` (stage's own is
tests/test_quota_stage.py, pull-through's refresh tests/test_quota_pull.py). `matrix` reads the ledger
alone: it sends nothing. And a scan cut short (by its wait bound, or kill -9) keeps every listing it got:
run again, it lists only the rest."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from frt.mirror.store.home import Home
from tests.support.cli import EXE, X86, cli_env, run_cli, run_cli_process
from tests.support.fakehub.wire import LoggedRequest
from tests.support.quota import DRIFT, STEADY, TIGHT, quota_hub


def api_requests(log: list[LoggedRequest]) -> list[LoggedRequest]:
    return [r for r in log if r.path.startswith("/api/") and not r.path.startswith("/api/resolve-cache/")]


def assert_paced(log: list[LoggedRequest]) -> int:
    """Each answer once, a request again only after its 429, at most one 429 a window, and the quota met
    (the command had windows to wait for). The number of API answers."""
    api = api_requests(log)
    refused = sum(r.status == 429 for r in api)
    answered = Counter((r.method, r.path) for r in api if r.status != 429)
    assert max(answered.values()) == 1, answered.most_common(3)
    assert len(answered) > 2 * TIGHT.api, "the command must need more than two windows' answers"
    assert refused <= math.ceil(len(answered) / TIGHT.api), refused
    return len(answered)


def listed(home: Path, repo: str) -> set[str]:
    """The commits whose build/ listing the ledger records."""
    h = Home(home)
    try:
        with h.ledger.view() as v:
            every = {c.sha for c in v.commits(repo)}
        return every - set(h.ledger.unscanned_commits(repo))
    finally:
        h.close()


def tree_shas(log: list[LoggedRequest]) -> Counter:
    """The commits a run asked build/ listings of, a count of pages each."""
    return Counter(r.path.split("/tree/")[1].split("/")[0] for r in log if "/tree/" in r.path and r.status == 200)


def test_scan_then_matrix_under_a_tight_quota(tmp_path):
    hub, _ = quota_hub()
    with hub:
        p = run_cli("--endpoint", hub.url, "scan", DRIFT, STEADY, "--json", home=tmp_path / "home")
        assert p.returncode == 0, p.stderr
        assert_paced(hub.request_log)
        assert [r["commits_scanned"] for r in json.loads(p.stdout)] == [8, 2]  # the stray commit: no ref reaches it
        sent = len(hub.request_log)
        p = run_cli("matrix", DRIFT, "--json", home=tmp_path / "home")
        assert p.returncode == 0, p.stderr
        assert len(hub.request_log) == sent, "matrix answers from the ledger"


def paced_once(hub, home: Path, command: str, *args: str) -> dict:
    """Run a command that scans `drift` under the quota: each answer once, the refs once (one scan in the
    run, however many resolves and stages it makes); its --json answer."""
    with hub:
        argv = ["--endpoint", hub.url, command, "--json", *args]
        # bisect in a process: it hands the command it bisects its stderr's file descriptor (run_bisect)
        p = run_cli_process(*argv, home=home, timeout=300) if command == "bisect" else run_cli(*argv, home=home)
        assert p.returncode == 0, p.stderr
        assert_paced(hub.request_log)
        assert sum(r.path.endswith("/refs") for r in hub.request_log) == 1, "the refs once: one scan"
    return json.loads(p.stdout)


def test_resolve_of_a_revision_no_ref_reaches_under_a_tight_quota(tmp_path):
    hub, pins = quota_hub()
    stray = pins[2]
    doc = paced_once(hub, tmp_path / "home", "resolve", DRIFT, "--revision", stray, "--target", X86)
    assert doc["commit"] == stray


def test_bisect_under_a_tight_quota_asks_each_answer_once(tmp_path):
    hub, _ = quota_hub()
    repo = hub.repos[("kernel", DRIFT)]
    v2 = [sha for sha, c in repo.commits.items() if c.title.startswith("v2 ")]
    good, bad, first_bad = v2[0], v2[-1], v2[2]
    judge = tmp_path / "judge.py"
    var = "FRT_KERNEL_REV_KERNELS_TEST_DRIFT"
    judge.write_text(f"import os, sys\nsys.exit(1 if os.environ[{var!r}] in {[first_bad, bad]!r} else 0)\n")
    args = ["bisect", DRIFT, "--good", good, "--bad", bad, "--target", X86, "--", sys.executable, str(judge)]
    doc = paced_once(hub, tmp_path / "home", *args)
    assert doc["first_bad"] == first_bad


def test_a_scan_cut_by_its_wait_bound_keeps_its_listings_and_lists_only_the_rest(tmp_path):
    home = tmp_path / "home"
    hub, _ = quota_hub()
    with hub:
        env = cli_env(FRT_RATE_LIMIT_MAX_WAIT="25")  # two windows' waits, not three
        p = run_cli("--endpoint", hub.url, "scan", DRIFT, home=home, env=env)
        assert p.returncode == 3, p.stderr
        assert "FRT_RATE_LIMIT_MAX_WAIT" in p.stderr.strip().splitlines()[-1]
        first = list(hub.request_log)
        kept = listed(home, DRIFT)
        assert kept, "whole listings were recorded before the cut"
        p = run_cli("--endpoint", hub.url, "scan", DRIFT, home=home)
        assert p.returncode == 0, p.stderr
        second = hub.request_log[len(first) :]
    assert not kept & set(tree_shas(second)), "a listing recorded is never asked again"
    assert listed(home, DRIFT) == kept | set(tree_shas(second))
    # Begun before the cut and not finished: asked again, whole (every page, not from where the cut left
    # it). How many were under way at the cut depends on how fast the threads asked their next pages;
    # that the window's last requests go to the listings under way is test_pacing's, on a fake clock.
    pages = max(tree_shas(second).values())
    assert all(tree_shas(second)[sha] == pages for sha in set(tree_shas(first)) - kept), tree_shas(second)


def test_a_scan_killed_mid_way_keeps_its_listings_and_lists_only_the_rest(tmp_path):
    home = tmp_path / "home"
    hub, _ = quota_hub()
    with hub:
        args = [EXE, "--home", str(home), "--endpoint", hub.url, "scan", DRIFT]
        proc = subprocess.Popen(args, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        try:
            while not (home / "ledger.sqlite").exists() or len(listed(home, DRIFT)) < 2:
                assert proc.poll() is None and time.monotonic() < deadline, "the scan ended before the kill"
                time.sleep(0.2)
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        kept = listed(home, DRIFT)
        before = len(hub.request_log)
        p = run_cli("--endpoint", hub.url, "scan", DRIFT, home=home)
        assert p.returncode == 0, p.stderr
        second = hub.request_log[before:]
    assert len(kept) >= 2 and not kept & set(tree_shas(second))
    assert len(listed(home, DRIFT)) == 8
