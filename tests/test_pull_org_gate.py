"""Pull-through's org overview (`GET /api/organizations/{org}/overview`) is gated before anything:
a string that is not a Hub org name is a 404 in one line, never asked upstream and never recorded,
even where the upstream would vouch for anything (issue 27, item 6: `acme-kernels%2F..%2Frogue-kernels`
was forwarded as sent and kept a publishers row per distinct client string)."""

from __future__ import annotations

import random
import sqlite3
import string
from pathlib import Path

import pytest

from tests.support.fakehub import FakeHub
from tests.support.kernel_fixtures import ORG, RELU, demo_repos
from tests.support.serve_helpers import raw_http, raw_request, run_client, serve_env, serving


class Everyone:
    """An upstream that says `trustedKernelPublisher: true` for whatever it is asked."""

    def __contains__(self, _org) -> bool:
        return True


HOSTILE_ORGS = [
    f"{ORG}%2F..%2Frogue-kernels",
    f"{ORG}%3Cscript%3E",
    f"{ORG}%2Fx",
    "-lead",
    "trail-",
    ".dot",
    "dot.",
    "a" * 97,
    "a--b",
    "a..b",
    "%E2%80%AEevil",
    "a%20b",
    "a%0Ab",
]


@pytest.fixture(scope="module")
def pulling(tmp_path_factory):
    home = tmp_path_factory.mktemp("org-gate") / "home"
    with FakeHub(demo_repos(), trusted_orgs=[ORG]) as hub:
        hub.trusted_orgs = Everyone()
        with serving(home, "--upstream", hub.url, "--allow", "*", env=serve_env()) as m:
            yield hub, m, home


def _overview_requests(hub: FakeHub) -> list[str]:
    return [path for _, path, _ in hub.requests if "/organizations/" in path]


@pytest.mark.parametrize("org", HOSTILE_ORGS)
def test_a_malformed_org_is_one_line_and_never_goes_upstream(pulling, org):
    hub, m, home = pulling
    hub.reset_log()
    status, headers, _ = raw_http(m.port, raw_request("GET", f"/api/organizations/{org}/overview"))
    assert status == 404, (org, status)
    message = headers["x-error-message"]
    assert "is not an org name" in message and "\n" not in message, message
    assert _overview_requests(hub) == []  # before: forwarded as sent


def test_only_well_formed_orgs_are_asked_and_recorded(pulling):
    """Under '*' the upstream's word on an org answers the client; it is recorded once a repo of the
    org is pulled (scan records it, after the upstream answered for the repo), not on the ask alone."""
    hub, m, home = pulling
    for org in HOSTILE_ORGS:
        raw_http(m.port, raw_request("GET", f"/api/organizations/{org}/overview"))
    hub.reset_log()
    status, _, body = raw_http(m.port, raw_request("GET", f"/api/organizations/{ORG}/overview"))
    assert status == 200 and b'"trustedKernelPublisher":true' in body.replace(b" ", b"")
    assert _overview_requests(hub) == [f"/api/organizations/{ORG}/overview"]
    assert _orgs(home) == []  # before: one row per hostile string too, and one per org asked
    assert raw_http(m.port, raw_request("GET", f"/api/kernels/{RELU}/refs"))[0] == 200
    assert _orgs(home) == [ORG]


def _orgs(home: Path) -> list[str]:
    with sqlite3.connect(home / "ledger.sqlite") as db:
        return [org for (org,) in db.execute("SELECT org FROM publishers")]


def _rows(home: Path) -> dict[str, int]:
    """Every table of the ledger and its row count."""
    with sqlite3.connect(home / "ledger.sqlite") as db:
        tables = [t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {t: db.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables}


# What kernels sends: serve counts a kernels client's misses as the fleet's demand (mirror/serve/demand.py).
KERNELS_AGENT = "User-Agent: kernels/0.17.2; python/3.11; backend/cpu; platform/x86_64-linux; torch/2.11.0"


def _scanner_asks(org: str, name: str, i: int) -> list[tuple[str, str]]:
    """What a client asks of a repo, one way or another (kernels' calls, a model's, a file's)."""
    repo = f"{org}/{name}"
    return [
        ("GET", f"/api/organizations/{org}/overview"),
        [
            ("GET", f"/api/kernels/{repo}/refs"),
            ("GET", f"/api/kernels/{repo}/tree/v1/build"),
            ("HEAD", f"/kernels/{repo}/resolve/v1/build/torch-universal/metadata.json"),
            ("GET", f"/api/models/{repo}/revision/main"),
            ("GET", f"/{repo}/resolve/main/config.json"),
            ("GET", f"/api/kernels/{repo}/revision/{'0' * 40}"),
        ][i % 6],
    ]


def test_a_scanner_under_the_wildcard_adds_no_row_and_a_real_repo_is_still_pulled(tmp_path):
    """`--allow '*'`: 200 repos under random orgs the upstream does not have (an upstream that vouches for
    any org it is asked about) add no row to any table of the ledger, demand included, with serve stopped
    (its counts written); kernels' get_kernel of a repo the upstream has is pulled and recorded as before."""
    home, rnd = tmp_path / "home", random.Random(47)
    with FakeHub(demo_repos(), trusted_orgs=[ORG]) as hub:
        hub.trusted_orgs = Everyone()
        args = ("--upstream", hub.url, "--allow", "*", "--upstream-timeout", "30")
        with serving(home, *args, env=serve_env()):
            pass  # the ledger's tables, created
        before = _rows(home)
        with serving(home, *args, env=serve_env()) as m:
            for i in range(200):
                org = "".join(rnd.choices(string.ascii_lowercase, k=10))
                for method, path in _scanner_asks(org, f"k{i}", i):
                    status, _, _ = raw_http(m.port, raw_request(method, path, KERNELS_AGENT), timeout=60)
                    assert status in (200, 404), (method, path, status)
        assert _rows(home) == before
        assert len({p for _, p, _ in hub.requests if "/refs" in p}) >= 200 // 6  # the upstream was asked
        with serving(home, *args, env=serve_env()) as m:
            code = f'import kernels\nk = kernels.get_kernel("{RELU}", version=1)\nreport([k.VERSION, k.VARIANT])\n'
            p, got = run_client(code, m.url, tmp_path / "hf", timeout=180, HF_HUB_ETAG_TIMEOUT="60")
            assert got is not None and got[0] == 1, p.stderr[-2000:]
    after = _rows(home)
    assert _orgs(home) == [ORG] and after["refs"] > before["refs"] and after["staged"] > before["staged"], after
