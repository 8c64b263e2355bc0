"""Pull-through's org overview (`GET /api/organizations/{org}/overview`) is gated before anything:
a string that is not a Hub org name is a 404 in one line, never asked upstream and never recorded,
even where the upstream would vouch for anything (issue 27, item 6: `acme-kernels%2F..%2Frogue-kernels`
was forwarded as sent and kept a publishers row per distinct client string)."""

from __future__ import annotations

import sqlite3

import pytest

from tests.support.fakehub import FakeHub
from tests.support.kernel_fixtures import ORG, demo_repos
from tests.support.serve_helpers import raw_http, raw_request, serve_env, serving


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
    hub, m, home = pulling
    for org in HOSTILE_ORGS:
        raw_http(m.port, raw_request("GET", f"/api/organizations/{org}/overview"))
    hub.reset_log()
    status, _, body = raw_http(m.port, raw_request("GET", f"/api/organizations/{ORG}/overview"))
    assert status == 200 and b'"trustedKernelPublisher":true' in body.replace(b" ", b"")
    assert _overview_requests(hub) == [f"/api/organizations/{ORG}/overview"]
    with sqlite3.connect(home / "ledger.sqlite") as db:
        orgs = [org for (org,) in db.execute("SELECT org FROM publishers")]
    assert orgs == [ORG]  # before: one row per hostile string too
