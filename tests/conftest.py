"""Shared fixtures: a fake upstream Hub serving the fixture kernels, a home, and the real CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakehub import FakeHub
from tests.kernel_fixtures import ORG, demo_repos

ROOT = Path(__file__).resolve().parent.parent
ACTIVATION = f"{ORG}/activation"
RELU = f"{ORG}/relu"


@pytest.fixture
def hub():
    with FakeHub(demo_repos(), trusted_orgs=[ORG], page_size=5) as h:
        yield h


@pytest.fixture
def home(tmp_path) -> Path:
    return tmp_path / "home"


def cli_env(**extra: str) -> dict[str, str]:
    # FRT_LEDGER_URL passes: it is how a module runs on the PostgreSQL ledger (see ledger_backend).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FRT_", "HF_")) or k == "FRT_LEDGER_URL"}
    env.update(HF_HUB_DISABLE_XET="1", FRT_RETRY_BASE_WAIT="0.01", PYTHONWARNINGS="ignore")
    env.update(extra)
    return env


def run_cli(*args: str, home: Path, env: dict | None = None, wrap: list[str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
    """Run the installed `frt-mirror` console script as a user would, in a subprocess."""
    exe = str(Path(sys.executable).with_name("frt-mirror"))
    return subprocess.run([*(wrap or []), exe, "--home", str(home), *args], capture_output=True, text=True,
                          env=env or cli_env(), timeout=timeout)


@pytest.fixture(scope="session")
def pg_server():
    """A real PostgreSQL for the session (tests/pgserver.py). Missing binaries fail, never skip: CI installs
    Debian's `postgresql` (.ci/run), so a PostgreSQL test that did not run would be a test that passed unseen."""
    problem = None
    try:
        from tests.pgserver import PgServer, PgUnavailable
    except ImportError as e:  # psycopg is in the test extra
        pytest.fail(f"the PostgreSQL tests need psycopg: pip install -e '.[test]' ({e})", pytrace=False)
    try:
        server = PgServer()
    except PgUnavailable as e:
        problem = str(e)
    if problem:  # outside the except block: one line, not the same line twice as a chained exception
        pytest.fail(problem, pytrace=False)
    try:
        yield server.start()
    finally:
        server.close()


@pytest.fixture
def pg_url(pg_server) -> str:
    """A SQLAlchemy URL (postgresql+psycopg://…) naming a fresh, empty database on `pg_server`."""
    pg_server.start()  # an earlier test may have stopped or crashed it and failed before restarting it
    url = pg_server.new_database()
    yield url
    if pg_server.running:  # drop it, or a long session fills the temp dir with ~7 MB per test
        pg_server.drop_database(url)


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
