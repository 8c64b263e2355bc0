"""Writers ride out a PostgreSQL ledger that restarts under them (issue 26, item 2).

A real server, really restarted (pg_ctl's fast shutdown: "terminating connection due to administrator
command", then refused connections until it is back): a stage in flight retries each ledger transaction
that met it, whole, and completes; past FRT_LEDGER_RETRY_S a command stops with one line naming the
ledger. Before, the stage went on downloading and exited 3 at its next ledger write.
"""

from __future__ import annotations

import json
import time

import psycopg
import pytest
import sqlalchemy as sa

from frt.mirror.events import record_event
from frt.mirror.schema import MIRROR_TRACK
from frt.mirror.store.home import open_ledger
from frt.mirror.store.records import staged_rows
from frt.resolver.errors import LedgerUnavailable
from frt.resolver.ledger import Ledger
from frt.resolver.ledger.retry import retry_budget
from tests.support.cli import cli_env, run_cli, start_cli
from tests.support.homes import empty_home
from tests.support.kernel_fixtures import RELU


def _events(url: str, kind: str) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            q = sa.text("SELECT count(*) FROM mirror_events WHERE kind = :k")
            return conn.execute(q, {"k": kind}).scalar()
    finally:
        engine.dispose()


def test_a_stage_rides_out_a_server_restart_and_records_every_row(big_hub, tmp_path, big_manifest, pg_server, pg_url):
    """The restart lands mid-download: the stage's next ledger writes meet dead connections, then refused
    ones. It completes (exit 0), verifies, and the ledger holds every staged row and one stage event."""
    home = tmp_path / "h"
    big_hub.faults.throttle("/resolve/", 1e6)  # a few seconds of downloads left when the server is back
    proc = start_cli("--ledger", pg_url, "--endpoint", big_hub.url, "stage", str(big_manifest), "--json", home=home)
    assert big_hub.wait_for_body(2, timeout=120), "the stage never reached its downloads"
    pg_server.restart()
    assert proc.poll() is None, "the stage was over before the server was back: no restart was met"
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    report = json.loads(out)
    assert report["ok"] and report["downloaded_bytes"] == report["needed_bytes"]
    v = run_cli("--ledger", pg_url, "verify", "--json", home=home)
    assert v.returncode == 0, v.stdout
    ledger = open_ledger(pg_url)
    try:
        recorded = {(r.repo, r.requested, r.target, r.commit, r.variant) for r in staged_rows(ledger)}
    finally:
        ledger.close()
    assert recorded == {(r["repo"], r["requested"], r["target"], r["commit"], r["variant"]) for r in report["rows"]}
    assert _events(pg_url, "stage") == 1


def _terminate(url: str, pid: int) -> None:
    with psycopg.connect(url.replace("postgresql+psycopg", "postgresql"), autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))


@pytest.mark.parametrize("how", ["terminate", "restart"])
def test_a_unit_whose_first_attempt_is_cut_commits_exactly_once(pg_server, pg_url, how):
    """The unit's row is written, then its connection is cut before the commit: the retry runs the
    whole unit again on a fresh connection, and the ledger holds its row once, not twice, not none."""
    ledger = Ledger(pg_url, tracks=(MIRROR_TRACK,), retry_s=30)
    attempts = []

    def unit() -> None:
        with ledger.transaction() as s:
            attempts.append(s.execute(sa.text("SELECT pg_backend_pid()")).scalar())
            record_event(ledger, "unit-test", detail="once")  # joins this session's transaction
            if len(attempts) == 1:
                _terminate(pg_url, attempts[0]) if how == "terminate" else pg_server.restart()

    try:
        ledger.retrying(unit)
    finally:
        ledger.close()
    assert len(attempts) == 2 and attempts[0] != attempts[1]
    assert _events(pg_url, "unit-test") == 1


def test_retries_stop_at_the_budget_with_one_line_naming_the_ledger(hub, tmp_path, pg_server, pg_url):
    scanned = run_cli("--ledger", pg_url, "--endpoint", hub.url, "scan", RELU, home=tmp_path / "h")
    assert scanned.returncode == 0, scanned.stderr
    pg_server.stop()
    try:
        started = time.monotonic()
        p = run_cli(
            "--ledger",
            pg_url,
            "--endpoint",
            hub.url,
            "scan",
            RELU,
            home=tmp_path / "h",
            env=cli_env(FRT_LEDGER_RETRY_S="2"),
        )
        took = time.monotonic() - started
    finally:
        pg_server.start()
    assert p.returncode == 3, p.stderr
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr
    assert f"ledger {pg_url.split('://')[0]}://" in p.stderr and "is unavailable" in p.stderr, p.stderr
    assert 2 <= took < 30, took  # it retried for the budget, then stopped


def test_without_a_budget_in_force_the_ledger_fails_at_once(pg_server, pg_url):
    """Readers (serve, resolve) keep failing fast: serve answers 503 and keeps what it has."""
    ledger = open_ledger(pg_url)
    pg_server.stop()
    try:
        started = time.monotonic()
        with pytest.raises(LedgerUnavailable):
            ledger.retrying(staged_rows, ledger)
        assert time.monotonic() - started < 5
    finally:
        pg_server.start()
        ledger.close()


def test_a_writer_command_rides_out_restarts_until_it_ends_not_after(tmp_path):
    """The budget is the command's: a writer command run in a process that goes on (click's CliRunner, a
    caller of the CLI's group) leaves the ledgers opened after it failing at once, not riding out a
    restart for FRT_LEDGER_RETRY_S. Before, `gc` left it set for the rest of the process (the ContextVar
    was set, never reset)."""
    from click.testing import CliRunner

    from frt.cli import cli

    home = empty_home(tmp_path / "h")  # gc reads a home: it no longer creates one
    assert CliRunner().invoke(cli, ["--home", str(home), "gc"]).exit_code == 0
    assert retry_budget() == 0.0
