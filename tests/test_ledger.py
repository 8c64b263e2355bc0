"""The SQLite ledger: schema versioning, corruption, and several processes writing at once."""

from __future__ import annotations

import multiprocessing as mp
import sqlite3
from pathlib import Path

import pytest

from frt.mirror.schema import MIRROR_TRACK, MIRROR_VERSION
from frt.mirror.serve.tokens import list_tokens
from frt.mirror.store.home import Home
from frt.resolver.core import resolve_request
from frt.resolver.errors import LedgerCorrupt
from frt.resolver.ledger import Ledger
from frt.resolver.ledger.schema import MIGRATIONS, RESOLVER_TRACK, SCHEMA_VERSION
from frt.resolver.resolution import Refusal, Request
from frt.resolver.targets import parse_target
from tests.support.cli import cli_env, run_cli
from tests.support.kernel_fixtures import RELU


def test_fresh_ledger_is_stamped_and_migrations_cover_every_version(tmp_path):
    Ledger(tmp_path / "l.sqlite").close()
    con = sqlite3.connect(tmp_path / "l.sqlite")
    assert con.execute("SELECT max(version) FROM schema_migrations").fetchone()[0] == SCHEMA_VERSION
    # Every version after the first has an explicit step; none is missing or extra.
    assert sorted(MIGRATIONS) == list(range(2, SCHEMA_VERSION + 1))


def test_a_newer_ledger_is_refused_not_downgraded(tmp_path):
    Ledger(tmp_path / "l.sqlite").close()
    con = sqlite3.connect(tmp_path / "l.sqlite")
    con.execute("INSERT INTO schema_migrations (version, applied_at) VALUES (?, '2030-01-01')", (SCHEMA_VERSION + 1,))
    con.commit()
    with pytest.raises(LedgerCorrupt, match="newer than this frt-mirror understands"):
        Ledger(tmp_path / "l.sqlite")


def test_garbage_file_is_ledger_corrupt(tmp_path):
    (tmp_path / "l.sqlite").write_bytes(b"\x00garbage" * 512)
    with pytest.raises(LedgerCorrupt, match="cannot be opened"):
        Ledger(tmp_path / "l.sqlite")


def _refuse_many(path: str, worker: int, n: int) -> None:
    led = Ledger(path)
    target = parse_target("torch2.13-cpu-x86_64-linux")
    for i in range(n):
        req = Request("org/k", version=i % 5 + 1)
        led.record_refusal(Refusal(req, target, "NoVariant", f"msg {worker}", detail=f"w{worker}-{i % 10}"))
    led.close()


def test_concurrent_writers_do_not_corrupt_or_lose_rows(tmp_path):
    path = str(tmp_path / "l.sqlite")
    Ledger(path).close()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_refuse_many, args=(path, w, 60)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    led = Ledger(path)
    rows = led.refusals()
    # 4 workers × 10 distinct details each; each (detail) seen 6 times; nothing lost or merged across workers.
    assert len(rows) == 40 and sum(r.count for r in rows) == 240
    assert sqlite3.connect(path).execute("PRAGMA integrity_check").fetchone()[0] == "ok"


V4_DUMP = Path(__file__).parent / "data" / "v4" / "ledger.sql"  # written by frt-mirror at 7bde11a (schema 4)


def old_ledger(path: Path, version: int = 4) -> None:
    """A ledger as an earlier release left it: the v4 one staged relu v1 for x86 CPU and added a
    token; for version 1, less what versions 2-4 added."""
    con = sqlite3.connect(path)
    con.executescript(V4_DUMP.read_text())
    if version == 1:
        con.executescript(
            "DROP TABLE blobs; DROP TABLE staged; DROP TABLE tokens; DROP TABLE publishers;"
            "DELETE FROM schema_migrations;"
            "INSERT INTO schema_migrations (version, applied_at) VALUES (1, '2026-11-01');"
        )
    con.close()


def test_a_version_1_ledger_is_migrated_keeping_its_rows(tmp_path):
    """A ledger written by the first release (schema 1) gains the store tables and keeps its refusals."""
    path = tmp_path / "ledger.sqlite"
    old_ledger(path, version=1)
    led = Ledger(path)
    led.record_refusal(
        Refusal(
            Request("org/k", version=1), parse_target("torch2.13-cpu-x86_64-linux"), "NoVariant", "kept", detail="d"
        )
    )
    led.close()
    home = Home(tmp_path)
    assert [r.message for r in home.ledger.refusals()] == ["kept"]
    home.close()
    con = sqlite3.connect(path)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"blobs", "staged", "tokens", "publishers", "listings"} <= tables
    assert con.execute("SELECT max(version) FROM schema_migrations").fetchone()[0] == SCHEMA_VERSION
    assert con.execute("SELECT max(version) FROM mirror_schema_migrations").fetchone()[0] == MIRROR_VERSION


def test_a_version_4_ledger_keeps_its_mirror_rows_and_its_history(tmp_path):
    """The v4 ledger's blobs, staged rows and token are the mirror's track's now, kept where they were;
    its parent links become each head's listing, the order the upstream listed it in, and go."""
    path = tmp_path / "ledger.sqlite"
    old_ledger(path)
    con = sqlite3.connect(path)
    chain = dict(con.execute("SELECT sha, parent_sha FROM commits"))
    head = con.execute("SELECT commit_sha FROM refs WHERE name = 'v1'").fetchone()[0]
    before = {t: con.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall() for t in ("blobs", "staged", "tokens")}
    con.close()
    home = Home(tmp_path)
    with home.ledger.view() as v:
        assert v.history(RELU, head) == [head, chain[head]] and chain[chain[head]] is None
        res = resolve_request(v, Request(RELU, version=1), parse_target("torch2.13-cpu-x86_64-linux"))
    assert [(r.repo, r.commit) for r in home.staged()] == [(RELU, res.commit)]
    assert [name for name, _ in list_tokens(home.ledger)] == ["old"]
    home.close()
    con = sqlite3.connect(path)
    assert {t: con.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall() for t in before} == before
    columns = {r[1] for r in con.execute("PRAGMA table_info(commits)")}
    assert "parent_sha" not in columns and "depth" in columns
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_migrations_are_tracked_per_layer():
    """The resolver's track holds no mirror table, and the mirror's no resolver table."""
    resolver_tables = set(RESOLVER_TRACK.metadata.tables)
    mirror_tables = set(MIRROR_TRACK.metadata.tables)
    assert {"blobs", "staged", "tokens"} <= mirror_tables and not resolver_tables & mirror_tables
    assert {"refs", "commits", "listings", "variants", "files", "refusals", "publishers"} <= resolver_tables


def test_a_ledger_locked_past_the_busy_timeout_is_one_line_and_exit_3(tmp_path):
    """Another process holds the write lock longer than FRT_LEDGER_BUSY_TIMEOUT: a writing command
    stops with "try again later" (exit 3, unavailable), not a traceback; a malformed timeout is bad input."""
    home = tmp_path / "home"
    Home(home).ledger.close()
    holder = sqlite3.connect(home / "ledger.sqlite", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # the write lock, as a stager mid-transaction holds it
    try:
        p = run_cli("token", "add", "ci", home=home, env=cli_env(FRT_LEDGER_BUSY_TIMEOUT="0.2"))
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert p.returncode == 3, p.stderr
    assert p.stderr.count("\n") == 1 and "locked by another process past the 0.2 s busy timeout" in p.stderr
    p = run_cli("token", "add", "ci", home=home, env=cli_env(FRT_LEDGER_BUSY_TIMEOUT="abc"))
    assert p.returncode == 2 and "FRT_LEDGER_BUSY_TIMEOUT='abc' is not a number" in p.stderr
    assert run_cli("token", "add", "ci", home=home).returncode == 0  # the lock is gone: it goes through
