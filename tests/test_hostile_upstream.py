"""A hostile upstream (tests/support/hostile.py: a proxy in front of the fake Hub that corrupts chosen
answers) against `stage` and against pull-through `serve`. Whatever it sends, the mirror answers with one
line and a contract exit code (3: the upstream's trouble, try again or elsewhere; 1: refused), never a
traceback, in bounded memory and bounded time; pull-through answers 502 with X-Error-Message (503 with
Retry-After for an upstream failing or too slow), and no thread keeps asking the upstream after its
request is over. Also in the huggingface_hub 1.33 venv (marked hub1).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from pathlib import Path

import pytest

from tests.support import hostile as h
from tests.support.cli import X86, cli_env, write_manifest
from tests.support.fakehub import FakeHub
from tests.support.kernel_fixtures import ORG, RELU, X86_CPU, demo_repos
from tests.support.rss import run_measured as launch_measured
from tests.support.serve_helpers import raw_http, raw_request, serving

pytestmark = pytest.mark.hub1

API = f"/api/kernels/{RELU}"
INIT = f"/build/{X86_CPU}/__init__.py"  # the one file of the chosen variant besides metadata.json
DEEP = b"[" * 100_000 + b"]" * 100_000
# Small caps so each case is quick; each names what it bounds (README, notes for operators).
LIMITS = {
    "FRT_RETRY_ATTEMPTS": "2",
    "FRT_RETRY_BASE_WAIT": "0.05",
    "FRT_UPSTREAM_DEADLINE_S": "2",
    "FRT_MAX_API_BYTES": str(1 << 20),
    "FRT_MAX_PAGES": "50",
}
MAX_RSS = 400 << 20  # a stage of relu needs ~100 MB; an unbounded read would pass this within a second
GUARD_AS = 3 << 30  # address-space ceiling for the child, so a regression cannot take the machine's memory
MAX_SECONDS = 60  # bounded, not fast: the unbounded cases ran forever; a loaded 2-core CI box took 20 s for one


def _bad_date(page):
    for c in page:
        c["date"] = "yesterday, around noon"


def _tree(answer):
    return [(f"{API}/tree/", answer)]


# id -> (rules, exit code, a word the one line must carry)
STAGE_CASES = {
    "refs-not-json": ([(f"{API}/refs", h.not_json())], 3, "not JSON"),
    "refs-branches-5": ([(f"{API}/refs", h.as_json({"branches": 5}))], 3, "branches"),
    "refs-100k-deep": ([(f"{API}/refs", h.replace(DEEP))], 3, "deep"),
    "refs-302-loop": ([(f"{API}/refs", h.redirect_loop())], 3, "redirect"),
    "refs-endless-500-body": ([(f"{API}/refs", h.endless(500))], 3, "500"),
    "refs-trickle": ([(f"{API}/refs", h.trickle(0.25))], 3, "deadline"),
    "overview-html": ([("/overview", h.not_json())], 3, "overview"),
    "commits-bad-date": ([(f"{API}/commits/", h.edit_json(_bad_date))], 3, "date"),
    "commits-endless-pages": ([(f"{API}/commits/", h.endless_pages())], 3, "pages"),
    "tree-object": (_tree(h.as_json({"entries": []})), 3, "list"),
    "tree-size-abc": (_tree(h.tree_file_field("size", "abc")), 3, "size"),
    "tree-size-null": (_tree(h.tree_file_field("size", None)), 3, "size"),
    # One past what the ledger's integers hold (SQLite's, PostgreSQL's bigint): the fuzz found it a traceback.
    "tree-size-2**63": (_tree(h.tree_file_field("size", 1 << 63)), 3, "size"),
    "tree-100k-deep": (_tree(h.replace(DEEP)), 3, "deep"),
    "tree-endless-200-body": (_tree(h.endless(200)), 3, "FRT_MAX_API_BYTES"),
    "tree-endless-pages": (_tree(h.endless_pages()), 3, "pages"),
    # At the default FRT_MAX_API_BYTES, so that the entry cap is what stops it (at its default too).
    "tree-100k-extra-entries": (
        _tree(h.extra_entries(100_000, f"build/{X86_CPU}/")),
        3,
        "entries",
        {"FRT_MAX_API_BYTES": str(64 << 20)},
    ),
    "metadata-100k-deep": (
        list(zip((f"{API}/tree/", "/metadata.json"), h.swap_metadata(DEEP), strict=False)),
        1,
        "metadata.json",
    ),
    # Found by tests/test_upstream_fuzz.py: a backend that is not an object was an AttributeError
    # (recording its archs); a line break in a value the parser quotes split the error line in two.
    "metadata-backend-true": (
        list(
            zip(
                (f"{API}/tree/", "/metadata.json"),
                h.swap_metadata(b'{"name": "relu", "version": 1, "backend": true, "python-depends": []}'),
                strict=False,
            )
        ),
        1,
        "metadata.json",
    ),
    "metadata-algorithm-crlf": (
        list(
            zip(
                (f"{API}/tree/", "/metadata.json"),
                h.swap_metadata(
                    b'{"name": "relu", "version": 1, "backend": {"type": "cpu"}, "python-depends": [], '
                    b'"digest": {"algorithm": "\\r\\nsha256", "files": {}}}'
                ),
                strict=False,
            )
        ),
        1,
        "metadata.json",
    ),
    "metadata-256MiB": ([("/metadata.json", h.huge(256 << 20))], 1, "metadata.json"),
    "file-endless-500-body": ([(INIT, h.endless(500))], 3, "500"),
    "file-302-loop": ([(INIT, h.redirect_loop())], 3, "redirect"),
    "file-redirect-to-file-url": ([(INIT, h.redirect("file:///etc/passwd"))], 3, "file://"),
    "file-trickle": ([(INIT, h.trickle(0.25))], 3, "deadline"),
    "file-listed-but-404": ([(INIT, h.status(404, "EntryNotFound"))], 1, "404"),
}
# The cases that must not be retried (the same answer would come again): how often the hostile answer may
# be asked for, one attempt (a loop: httpx's 20 hops, then refused).
AT_ONCE = {
    "refs-not-json": 1,
    "refs-302-loop": 21,
    "file-redirect-to-file-url": 1,
    "file-302-loop": 21,
    "file-listed-but-404": 1,
}


@pytest.fixture(scope="module")
def upstream():
    with FakeHub(demo_repos(), trusted_orgs=[ORG], page_size=5) as hub:
        yield hub


@pytest.fixture
def proxy(upstream):
    with h.HostileProxy(upstream.url) as p:
        yield p


def run_measured(args: list[str], env: dict, timeout: float = 2 * MAX_SECONDS) -> tuple[int, str, float, int]:
    """Run the CLI under the address-space guard; (exit code, stderr, seconds, the CLI process's own max RSS
    in bytes, from wait4: tests/support/rss.py, where a small launcher forks it, not this pytest worker)."""
    exe = str(Path(sys.executable).with_name("frt-mirror"))
    run = launch_measured([exe, *args], env, timeout=timeout, guard_as=GUARD_AS)
    return run.returncode, run.stderr, run.seconds, run.max_rss


@pytest.mark.parametrize("case", sorted(STAGE_CASES))
def test_stage_against_a_hostile_upstream_is_one_line_and_a_contract_code(case, proxy, tmp_path):
    rules, code, word, *env = STAGE_CASES[case]
    made = [proxy.rule(match, answer) for match, answer in rules]
    manifest = write_manifest(tmp_path / "m.toml", {RELU: {"version": 1}}, [X86])
    rc, err, took, rss = run_measured(
        ["--home", str(tmp_path / "home"), "--endpoint", proxy.url, "stage", str(manifest)],
        cli_env(**{**LIMITS, **(env[0] if env else {})}),
    )
    lines = err.strip().splitlines()
    assert rc == code and len(lines) == 1 and "Traceback" not in err, (rc, err[-3000:])
    assert lines[0].startswith("frt-mirror: ") and word.lower() in lines[0].lower(), lines
    assert proxy.hits(made[-1]) >= 1, "the hostile answer was never asked for"
    if case in AT_ONCE:
        assert proxy.hits(made[-1]) <= AT_ONCE[case], f"asked {proxy.hits(made[-1])} times for the same answer"
    assert rss < MAX_RSS, f"max RSS {rss >> 20} MiB"
    assert took < MAX_SECONDS, f"took {took:.1f} s"


# -- pull-through --------------------------------------------------------------------------------

REFS = ("GET", f"{API}/refs")
FILE = ("GET", f"/kernels/{RELU}/resolve/v1{INIT}")
PULL_CASES = {
    "refs-not-json": ([(f"{API}/refs", h.not_json())], REFS),
    "refs-branches-5": ([(f"{API}/refs", h.as_json({"branches": 5}))], REFS),
    "refs-100k-deep": ([(f"{API}/refs", h.replace(DEEP))], REFS),
    "refs-302-loop": ([(f"{API}/refs", h.redirect_loop())], REFS),
    "refs-endless-500-body": ([(f"{API}/refs", h.endless(500))], REFS),
    "refs-trickle": ([(f"{API}/refs", h.trickle(0.25))], REFS),
    "commits-bad-date": ([(f"{API}/commits/", h.edit_json(_bad_date))], REFS),
    "tree-object": (_tree(h.as_json({"entries": []})), REFS),
    "tree-size-abc": (_tree(h.tree_file_field("size", "abc")), REFS),
    "tree-size-2**63": (_tree(h.tree_file_field("size", 1 << 63)), REFS),
    "tree-endless-200-body": (_tree(h.endless(200)), REFS),
    "tree-endless-pages": (_tree(h.endless_pages()), REFS),
    "file-endless-500-body": ([(INIT, h.endless(500))], FILE),
    "file-redirect-to-file-url": ([(INIT, h.redirect("file:///etc/passwd"))], FILE),
    "file-listed-but-404": ([(INIT, h.status(404, "EntryNotFound"))], FILE),
}

# An upstream that keeps failing (5xx) or is too slow (past FRT_UPSTREAM_DEADLINE_S) is unavailable: 503 with
# Retry-After. The rest answer, and wrongly: 502.
UNAVAILABLE = {"refs-endless-500-body", "file-endless-500-body", "refs-trickle"}


def proc_status(pid: int) -> dict[str, str]:
    text = Path(f"/proc/{pid}/status").read_text()
    return dict(re.findall(r"^(\w+):\s+(.*)$", text, re.M))


def serve_env(**extra: str) -> dict:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("FRT_", "HF_", "LOCAL_KERNELS"))}
    return {**base, "PYTHONWARNINGS": "ignore", "HF_HUB_DISABLE_XET": "1", **LIMITS, **extra}


@contextlib.contextmanager
def pulling(home: Path, proxy: h.HostileProxy, timeout: str = "10", **env: str):
    with serving(
        home, "--upstream", proxy.url, "--allow", ORG, "--upstream-timeout", timeout, env=serve_env(**env)
    ) as m:
        yield m


@pytest.mark.parametrize("case", sorted(PULL_CASES))
def test_pull_through_against_a_hostile_upstream_is_a_502_with_its_reason(case, proxy, tmp_path):
    rules, (method, path) = PULL_CASES[case]
    with pulling(tmp_path / "home", proxy) as m:
        if path != REFS[1]:  # a file: the listing first, untouched
            assert raw_http(m.port, raw_request("GET", REFS[1]), timeout=30)[0] == 200
        for match, answer in rules:
            proxy.rule(match, answer)
        t0 = time.monotonic()
        status, headers, _ = raw_http(m.port, raw_request(method, path), timeout=30)
        took = time.monotonic() - t0
        rss = int(proc_status(m.proc.pid)["VmHWM"].split()[0]) * 1024
        if case in UNAVAILABLE:  # failing or too slow, not wrong: come back (serve/unavailable.py)
            assert status == 503 and int(headers.get("retry-after", 0)) >= 1, (status, headers)
        else:
            assert status == 502, (status, headers)
        assert headers.get("x-error-message"), headers
        assert took < MAX_SECONDS and rss < MAX_RSS, (took, rss >> 20)
        assert "Traceback" not in m.stderr(), m.stderr()[-3000:]


def test_pull_through_paging_without_end_stops_when_its_request_is_over(proxy, tmp_path):
    """Refreshes that time out (the client gets its 503) must not go on paging: each ends within the
    upstream deadline, and the threads that ran them are not left behind."""
    rule = proxy.rule(f"{API}/tree/", h.endless_pages())
    with pulling(tmp_path / "home", proxy, timeout="0.5", FRT_MAX_PAGES="100000") as m:
        base = int(proc_status(m.proc.pid)["Threads"])
        shas = [f"{i:040x}" for i in range(1, 9)]  # each sha nobody listed is a refresh of its own
        peak = base
        for sha in [None, *shas]:
            rev = f"/revision/{sha}" if sha else "/refs"
            status, _, _ = raw_http(m.port, raw_request("GET", f"{API}{rev}"), timeout=30)
            assert status in (502, 503, 404), status
            peak = max(peak, int(proc_status(m.proc.pid)["Threads"]))
        time.sleep(float(LIMITS["FRT_UPSTREAM_DEADLINE_S"]) * 2 + 1)
        asked = proxy.hits(rule)
        time.sleep(1.5)
        assert proxy.hits(rule) == asked, "still paging after every refresh's deadline"
        assert peak - base < 80, (base, peak)
        assert "Traceback" not in m.stderr(), m.stderr()[-3000:]


# -- the ledger is never held for a whole history ----------------------------------------------------


def test_scan_writes_listings_a_few_commits_per_transaction(tmp_path, monkeypatch):
    """One write holds the ledger's write lock while it runs: a whole history's listings in one (100k rows
    took ~40 s) held it past the 30 s busy timeout, and every other writer failed with a false "locked by
    another process". Each write now carries at most ROWS_PER_WRITE rows, or one commit's listing."""
    import importlib

    from frt.resolver.hub import HubClient
    from frt.resolver.ledger import Ledger

    scan_module = importlib.import_module("frt.resolver.scan")
    monkeypatch.setattr(scan_module, "ROWS_PER_WRITE", 40)
    ledger = Ledger(tmp_path / "ledger.sqlite")
    writes: list[tuple[int, int]] = []  # (commits, rows) per write
    record = ledger.record_builds

    def counted(repo_id, builds):
        writes.append((len(builds), sum(len(vs) + sum(len(v.files) for v in vs) for vs in builds.values())))
        return record(repo_id, builds)

    monkeypatch.setattr(ledger, "record_builds", counted)
    with FakeHub(demo_repos(), trusted_orgs=[ORG]) as hub:
        report = scan_module.scan(f"{ORG}/activation", hub=HubClient(hub.url), ledger=ledger)
    assert report.commits_scanned == 6 and sum(c for c, _ in writes) == 6, writes
    assert len(writes) > 1 and all(commits == 1 or rows <= 40 for commits, rows in writes), writes
