"""The upstream's JSON routes under fuzz (issue 27): whatever a broken or hostile upstream puts in an answer
(any value at any place of the real answer, a key gone, the whole answer replaced), `stage` ends with a
contract exit code and, when it fails, one line — never a traceback — and what it did stage verifies; a
pull-through `serve` answers no 500 and logs no traceback.

The answers are the fake Hub's own, changed on their way through tests/support/hostile.py's proxy: a mutation
plan (where, what) is drawn by hypothesis and applied to whatever JSON the route answers, so examples stay
close enough to a real answer to get past the first check and reach the code behind it. test_hostile_
upstream.py holds the named cases (endless bodies, paging, redirects); this is the search for the ones
nobody named. `stage` runs in-process (click's CliRunner) for speed; `serve` in a subprocess.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from frt.cli import cli
from tests.support import hostile as h
from tests.support.cli import X86, write_manifest
from tests.support.fakehub import FakeHub
from tests.support.kernel_fixtures import ORG, RELU, X86_CPU, demo_repos
from tests.support.serve_helpers import raw_http, raw_request, serving

pytestmark = pytest.mark.hub1

API = f"/api/kernels/{RELU}"
# route -> the proxy rule's match (a substring of the request path)
ROUTES = {
    "refs": f"{API}/refs",
    "revision": f"{API}/revision/",
    "commits": f"{API}/commits/",
    "tree": f"{API}/tree/",
    "overview": f"/api/organizations/{ORG}/overview",
}
LIMITS = {
    "FRT_RETRY_ATTEMPTS": "1",
    "FRT_RETRY_BASE_WAIT": "0.01",
    "FRT_UPSTREAM_DEADLINE_S": "5",
    "FRT_MAX_API_BYTES": str(1 << 20),
    "FRT_MAX_PAGES": "50",
    "HF_HUB_DISABLE_XET": "1",
    "FRT_LEDGER_URL": None,
    "FRT_MIRROR_HOME": None,
    "HF_ENDPOINT": None,
    "LOCAL_KERNELS": None,
}
CONTRACT = {0, 1, 2, 3}
EXAMPLES = int(os.environ.get("FRT_FUZZ_EXAMPLES", "60"))

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([2**64, -1, 0, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(
        [
            "",
            "main",
            "v1",
            "0" * 40,
            "../x",
            "build/../../etc",
            "\u202e",
            "file",
            "directory",
            "2026-13-45T99:99:99Z",
            "2024-01-01T00:00:00.000Z",
            "sha256:" + "0" * 64,
        ]
    ),
)
VALUES = st.recursive(
    SCALARS, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3), max_leaves=6
)
# (where: a fraction of the way through the answer's places, what: replace/drop/whole, the new value)
PLANS = st.tuples(st.floats(0, 1, exclude_max=True), st.sampled_from(["replace", "replace", "drop", "whole"]), VALUES)


def places(doc, at=()):
    """Every place in a JSON document, as the path of keys and indices that reaches it."""
    yield at
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for k, v in items:
        yield from places(v, (*at, k))


def mutate(doc, plan):
    """The document with the plan applied (in place where it can be); the same plan, the same change."""
    where, what, value = plan
    if what == "whole":
        return value
    spots = list(places(doc))[1:]
    if not spots:
        return value
    *parent, last = spots[int(where * len(spots))]
    holder = doc
    for k in parent:
        holder = holder[k]
    if what == "drop":
        del holder[last]
    else:
        holder[last] = value
    return doc


def _lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]


@pytest.fixture(scope="module")
def upstream():
    with FakeHub(demo_repos(), trusted_orgs=[ORG], page_size=5) as hub:
        yield hub


@pytest.fixture(scope="module")
def proxy(upstream):
    with h.HostileProxy(upstream.url) as p:
        yield p


@pytest.fixture(scope="module")
def manifest(tmp_path_factory) -> Path:
    return write_manifest(tmp_path_factory.mktemp("fuzz") / "m.toml", {RELU: {"version": 1}}, [X86])


@pytest.fixture(scope="module")
def metadata(upstream) -> dict:
    """relu's real metadata.json for the staged variant (the fuzz changes it, and the listing to match)."""
    import urllib.request

    url = f"{upstream.url}/kernels/{RELU}/resolve/v1/build/{X86_CPU}/metadata.json"
    with urllib.request.urlopen(url) as r:
        return json.loads(r.read())


def invoke(*argv: str):
    result = CliRunner().invoke(cli, list(argv), env=LIMITS, prog_name="frt-mirror", catch_exceptions=True)
    assert result.exception is None or isinstance(result.exception, SystemExit), (argv, result.exc_info)
    return result


def check_stage(proxy, manifest) -> None:
    with tempfile.TemporaryDirectory() as home:
        r = invoke("--home", home, "--endpoint", proxy.url, "stage", str(manifest))
        err = r.stderr
        event(f"exit {r.exit_code}")
        assert r.exit_code in CONTRACT and "Traceback" not in err + r.stdout, (r.exit_code, err[-2000:])
        if r.exit_code:
            lines = _lines(err)
            assert len(lines) == 1 and lines[0].startswith("frt-mirror: "), err[-2000:]
        else:  # what a changed answer let through is still what the publisher published
            v = invoke("--home", home, "verify")
            assert v.exit_code == 0, v.stderr[-2000:]


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(route=st.sampled_from(sorted(ROUTES)), plan=PLANS, every=st.booleans())
def test_stage_survives_any_change_to_a_json_answer(proxy, manifest, route, plan, every):
    proxy.rules.clear()
    # every=False: only the first answer of the route is changed (a later page, a retry, are the real ones)
    proxy.rule(ROUTES[route], h.edit_json(lambda doc: mutate(doc, plan)), times=None if every else 1)
    try:
        check_stage(proxy, manifest)
    finally:
        proxy.rules.clear()


def _json_bytes(doc) -> bytes:
    try:
        return json.dumps(doc).encode()
    except (ValueError, TypeError):  # pragma: no cover - every drawn value dumps
        return b"null"


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(plan=PLANS)
def test_stage_survives_any_change_to_a_metadata_json(proxy, manifest, metadata, plan):
    """A publisher's metadata.json (listed with its own oid and size, so the bytes reach the parser)."""
    body = _json_bytes(mutate(json.loads(json.dumps(metadata)), plan))
    tree, file = h.swap_metadata(body)
    proxy.rules.clear()
    proxy.rule(ROUTES["tree"], tree)
    proxy.rule("/metadata.json", file)
    try:
        check_stage(proxy, manifest)
    finally:
        proxy.rules.clear()


# -- pull-through ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pulling(proxy, tmp_path_factory):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FRT_", "HF_", "LOCAL_KERNELS"))}
    env.update({k: v for k, v in LIMITS.items() if v is not None}, PYTHONWARNINGS="ignore")
    home = tmp_path_factory.mktemp("fuzz-pull") / "home"
    # --refs-ttl 0: every request asks the upstream again, so every example's answer is read
    with serving(
        home, "--upstream", proxy.url, "--allow", ORG, "--refs-ttl", "0", "--upstream-timeout", "10", env=env
    ) as m:
        yield m


PULL_PATHS = {
    "refs": f"{API}/refs",
    "revision": f"{API}/revision/v1",
    "tree": f"{API}/tree/v1",
    "overview": f"/api/organizations/{ORG}/overview",
    "file": f"/kernels/{RELU}/resolve/v1/build/{X86_CPU}/metadata.json",
}


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(route=st.sampled_from(["refs", "revision", "overview"]), plan=PLANS, ask=st.sampled_from(sorted(PULL_PATHS)))
def test_pull_through_answers_no_500_to_any_change(pulling, proxy, route, plan, ask):
    proxy.rules.clear()
    proxy.rule(ROUTES[route], h.edit_json(lambda doc: mutate(doc, plan)))
    try:
        status, headers, _ = raw_http(pulling.port, raw_request("GET", PULL_PATHS[ask]), timeout=30)
        event(f"status {status}")
    finally:
        proxy.rules.clear()
    assert status < 500 or (status in (502, 503) and headers.get("x-error-message")), (status, headers)
    assert "Traceback" not in pulling.stderr(), pulling.stderr()[-3000:]


def test_the_mutations_reach_every_place():
    """The plan's `where` covers the whole answer: its first and last places are both reachable."""
    doc = {"a": [1, {"b": 2}], "c": "d"}
    assert mutate(json.loads(json.dumps(doc)), (0.0, "drop", None)) == {"c": "d"}
    assert mutate(json.loads(json.dumps(doc)), (0.999, "replace", 5)) == {"a": [1, {"b": 2}], "c": 5}
    assert mutate(doc, (0.5, "whole", math.inf)) == math.inf
