"""The ledger on a real PostgreSQL (tests/support/pgserver.py), where SQLite's answers do not carry over:
several stagers coordinating through the database, the server down or restarting, a schema newer than the
code. The ordinary scan/resolve/stage/serve tests also run on it (conftest.ledger_backend / ledger_each)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.support.big_kernel import BIG
from tests.support.cli import X86, run_cli, run_resolve, start_cli, write_manifest
from tests.support.kernel_fixtures import ORG, RELU
from tests.support.stage_race import two_stagers


def stager(home: Path, manifest: Path, hub, url: str, *, own_locks: bool) -> subprocess.Popen:
    """A stager as on its own host: `own_locks` gives it a private locks/ folder (a tmpfs over it in
    its own mount namespace), so file locks do not reach the other stager, as on a shared filesystem
    that does not honour them across hosts. Only the ledger's server can coordinate the two then."""
    wrap = None
    if own_locks:
        (home / "locks").mkdir(parents=True, exist_ok=True)
        wrap = ["unshare", "-m", "sh", "-c", f'mount -t tmpfs none "{home}/locks" && exec "$@"', "sh"]
    return start_cli("--ledger", url, "--endpoint", hub.url, "stage", str(manifest), "--json", home=home, wrap=wrap)


def test_two_stagers_on_two_hosts_fetch_each_blob_once(big_hub, tmp_path, big_manifest, pg_url):
    """One shared home, one PostgreSQL ledger, two stagers whose file locks cannot see each other; the
    second starts while the first is mid-download. The server's advisory lock per blob lets one fetch
    and the other wait and reuse: every body crosses once, and the store verifies."""
    home = tmp_path / "shared"
    big_hub.faults.throttle("/resolve/", 0.4e6)  # each big body takes seconds: the second stager meets them
    for repo in (BIG, RELU):  # both start from one scanned ledger (a scan reads metadata.json too)
        assert run_cli("--ledger", pg_url, "--endpoint", big_hub.url, "scan", repo, home=home).returncode == 0
    big_hub.reset_log()
    two_stagers(big_hub, lambda i: stager(home, big_manifest, big_hub, pg_url, own_locks=i == 1))
    v = run_cli("--ledger", pg_url, "verify", "--json", home=home)
    assert v.returncode == 0, v.stdout


def test_resolve_offline_reads_only_the_server(hub, tmp_path, pg_url):
    """A second host with its own (empty) home and the same ledger resolves offline: no upstream."""
    m = write_manifest(tmp_path / "m.toml", {RELU: {"version": 1}}, [X86])
    assert run_cli("--ledger", pg_url, "--endpoint", hub.url, "stage", str(m), home=tmp_path / "a").returncode == 0
    hub.reset_log()
    before = ("--ledger", pg_url, "--endpoint", "http://127.0.0.1:9")
    p = run_resolve(RELU, "1", X86, "--offline", "--json", before=before, home=tmp_path / "b")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["variant"] == "torch213-cxx11-cpu-x86_64-linux" and hub.requests == []


def test_an_unreachable_server_is_one_line_and_exit_3(tmp_path, pg_server):
    dead = pg_server.url_for("nothing").rsplit(":", 1)[0] + ":9/nothing"
    for args in (["matrix", RELU], ["resolve", RELU, "--version", "1", "--target", X86, "--offline"]):
        p = run_cli("--ledger", dead, *args, home=tmp_path / "h")
        assert p.returncode == 3, p.stderr
        assert p.stderr.count("\n") == 1 and "is unavailable" in p.stderr and "Connection refused" in p.stderr


@pytest.mark.parametrize(
    "text, says",
    [
        ("mysql://u@h/db", "keeps its ledger in SQLite"),
        ("not a url://", "is not a URL"),
    ],
)
def test_a_ledger_url_we_do_not_speak_is_bad_input(tmp_path, text, says):
    p = run_cli("--ledger", text, "matrix", RELU, home=tmp_path / "h")
    assert p.returncode == 2 and says in p.stderr and p.stderr.count("\n") == 1, p.stderr


def test_a_newer_schema_on_the_server_is_refused_not_downgraded(hub, tmp_path, pg_url):
    assert run_cli("--ledger", pg_url, "--endpoint", hub.url, "scan", RELU, home=tmp_path / "h").returncode == 0
    engine = sa.create_engine(pg_url)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO schema_migrations (version, applied_at) SELECT max(version) + 1, now() FROM schema_migrations"
        )
        before = conn.exec_driver_sql("SELECT max(version) FROM schema_migrations").scalar()
    p = run_cli("--ledger", pg_url, "matrix", RELU, home=tmp_path / "h")
    assert p.returncode == 2 and "newer than this frt-mirror understands" in p.stderr, p.stderr
    with engine.begin() as conn:
        assert conn.exec_driver_sql("SELECT max(version) FROM schema_migrations").scalar() == before
    engine.dispose()


@pytest.mark.parametrize("how", ["restart", "crash"])
def test_the_server_restarting_mid_stage_loses_nothing_and_a_rerun_completes(
    big_hub, tmp_path, big_manifest, pg_server, pg_url, how
):
    """The stage either rides it out or stops with one line (exit 3); what it recorded is intact, and a
    rerun completes and verifies."""
    home = tmp_path / "h"
    big_hub.faults.throttle("/resolve/", 8e6)
    proc = start_cli("--ledger", pg_url, "--endpoint", big_hub.url, "stage", str(big_manifest), "--json", home=home)
    assert big_hub.wait_for_body(2, timeout=120), "the stage never reached its downloads"
    pg_server.kill() if how == "crash" else pg_server.stop()
    time.sleep(0.5)
    pg_server.start()
    out, err = proc.communicate(timeout=300)
    assert proc.returncode in (0, 3), err
    if proc.returncode == 3:
        assert err.count("\n") == 1 and "unavailable" in err and "Traceback" not in err, err
    big_hub.faults.clear()
    p = run_cli("--ledger", pg_url, "--endpoint", big_hub.url, "stage", str(big_manifest), "--json", home=home)
    assert p.returncode == 0, p.stderr
    v = run_cli("--ledger", pg_url, "verify", "--json", home=home)
    assert v.returncode == 0, v.stdout


def test_orgs_trust_and_tokens_live_in_the_server(hub, tmp_path, pg_url):
    """What a second host's serve needs from the ledger is there: publishers and tokens."""
    assert run_cli("--ledger", pg_url, "--endpoint", hub.url, "scan", RELU, home=tmp_path / "a").returncode == 0
    assert run_cli("--ledger", pg_url, "token", "add", "site", home=tmp_path / "a").returncode == 0
    p = run_cli("--ledger", pg_url, "token", "list", "--json", home=tmp_path / "b")
    assert [t["name"] for t in json.loads(p.stdout)] == ["site"]
    engine = sa.create_engine(pg_url)
    with engine.begin() as conn:
        assert conn.exec_driver_sql(f"SELECT trusted FROM publishers WHERE org = '{ORG}'").scalar() is True
    engine.dispose()
