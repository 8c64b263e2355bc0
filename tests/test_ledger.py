"""The SQLite ledger: schema versioning, corruption, and several processes writing at once."""

from __future__ import annotations

import multiprocessing as mp
import sqlite3

import pytest

from frt.resolver import Ledger, LedgerCorrupt, Refusal, Request, parse_target
from frt.resolver.schema import MIGRATIONS, SCHEMA_VERSION


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


def test_a_version_1_ledger_is_migrated_keeping_its_rows(tmp_path):
    """A ledger written by the first release (schema 1) gains the store tables and keeps its refusals."""
    path = tmp_path / "l.sqlite"
    led = Ledger(path)
    led.record_refusal(Refusal(Request("org/k", version=1), parse_target("torch2.13-cpu-x86_64-linux"),
                               "NoVariant", "kept", detail="d"))
    led.close()
    con = sqlite3.connect(path)  # roll it back to what version 1 had
    con.executescript("DROP TABLE blobs; DROP TABLE staged; DROP TABLE tokens; DELETE FROM schema_migrations;"
                      "INSERT INTO schema_migrations (version, applied_at) VALUES (1, '2026-11-01');")
    con.close()
    led = Ledger(path)
    assert [r.message for r in led.refusals()] == ["kept"]
    con = sqlite3.connect(path)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"blobs", "staged", "tokens"} <= tables
    assert con.execute("SELECT max(version) FROM schema_migrations").fetchone()[0] == SCHEMA_VERSION
