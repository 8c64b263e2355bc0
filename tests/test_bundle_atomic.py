"""An import's ledger rows land in one transaction: a failure part-way leaves the ledger as it was.

The failure is real, not a mock: a SQLite trigger in the importing home's own ledger aborts the
import's last ledger write (its event row), after every blob has been verified and stored. Before,
each repo's refs, history and builds were committed one by one, so such a failure left the ledger
half-merged: refs pointing at commits whose builds were not yet recorded.
"""

from __future__ import annotations

import sqlite3
from contextlib import contextmanager

from tests.support.bundles import import_offline, make_bundle
from tests.support.cli import run_cli


def _dump(home) -> list[str]:
    with sqlite3.connect(home / "ledger.sqlite") as db:
        return list(db.iterdump())


def test_a_failed_ledger_write_leaves_the_ledger_as_it_was(home_a, tmp_path):
    b = tmp_path / "b"
    assert import_offline(b, home_a.x86).returncode == 0  # a home that already holds something
    with sqlite3.connect(b / "ledger.sqlite") as db:
        db.execute(
            "CREATE TRIGGER fail_import BEFORE INSERT ON mirror_events "
            "BEGIN SELECT RAISE(ABORT, 'injected failure'); END"
        )
    before = _dump(b)
    p = import_offline(b, home_a.full)
    assert p.returncode != 0, p.stdout
    assert _dump(b) == before  # no ref, commit, build, publisher, blob or staged row of the bundle

    with sqlite3.connect(b / "ledger.sqlite") as db:
        db.execute("DROP TRIGGER fail_import")
    p = import_offline(b, home_a.full, "--json")
    assert p.returncode == 0, p.stderr
    assert run_cli("verify", home=b).returncode == 0
    # The retried import leaves what a clean one does: the same staged rows as a bundle from a fresh import.
    fresh = tmp_path / "fresh"
    assert import_offline(fresh, home_a.full).returncode == 0
    assert make_bundle(b, tmp_path / "again.tar")["staged"] == make_bundle(fresh, tmp_path / "fresh.tar")["staged"]


@contextmanager
def _connection(url: str, *, begin: bool = False):
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    try:
        with engine.begin() if begin else engine.connect() as conn:
            yield conn
    finally:
        engine.dispose()


def _counts(url: str) -> dict[str, int]:
    import sqlalchemy as sa

    with _connection(url) as conn:
        return {
            t: conn.exec_driver_sql(f'SELECT count(*) FROM "{t}"').scalar() for t in sa.inspect(conn).get_table_names()
        }


def _sql(url: str, *statements: str) -> None:
    with _connection(url, begin=True) as conn:
        for st in statements:
            conn.exec_driver_sql(st)


def test_on_postgresql_too_a_failed_ledger_write_leaves_the_ledger_as_it_was(home_a, tmp_path, pg_url):
    b = tmp_path / "b"
    assert run_cli("--ledger", pg_url, "import", str(home_a.x86), home=b).returncode == 0
    _sql(
        pg_url,
        "CREATE FUNCTION fail_import() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN RAISE EXCEPTION 'injected failure'; END $$",
        "CREATE TRIGGER fail_import BEFORE INSERT ON mirror_events FOR EACH ROW EXECUTE FUNCTION fail_import()",
    )
    before = _counts(pg_url)
    p = run_cli("--ledger", pg_url, "import", str(home_a.full), home=b)
    assert p.returncode != 0, p.stdout
    assert _counts(pg_url) == before
    _sql(pg_url, "DROP TRIGGER fail_import ON mirror_events")
    assert run_cli("--ledger", pg_url, "import", str(home_a.full), home=b).returncode == 0
    after = _counts(pg_url)
    assert after["staged"] > before["staged"] and after["mirror_events"] == before["mirror_events"] + 1
