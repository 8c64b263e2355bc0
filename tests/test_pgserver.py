"""The PostgreSQL fixture itself (tests/support/pgserver.py): a real server that SQLAlchemy + psycopg talk
to, a separate database per test, and a restart that keeps the data and the URL."""

from __future__ import annotations

import sqlalchemy as sa

ITEMS = sa.Table(
    "items", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True), sa.Column("name", sa.Text, nullable=False)
)


def names(url: str) -> list[str]:
    """Read through a new engine, so nothing cached in the writer's connection can answer."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return list(conn.scalars(sa.select(ITEMS.c.name).order_by(ITEMS.c.id)))
    finally:
        engine.dispose()


def has_items(url: str) -> bool:
    engine = sa.create_engine(url)
    try:
        return sa.inspect(engine).has_table("items")
    finally:
        engine.dispose()


def write(url: str, *values: str) -> None:
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            ITEMS.create(conn, checkfirst=True)
            conn.execute(sa.insert(ITEMS), [{"name": v} for v in values])
    finally:
        engine.dispose()


def test_sqlalchemy_writes_and_a_second_connection_reads(pg_url):
    assert pg_url.startswith("postgresql+psycopg://")
    write(pg_url, "activation", "relu")
    assert names(pg_url) == ["activation", "relu"]
    engine = sa.create_engine(pg_url)
    try:
        with engine.connect() as conn:
            assert conn.scalar(sa.text("SHOW server_version")).startswith(("15", "16", "17", "18"))
    finally:
        engine.dispose()


def test_two_pg_urls_are_separate_databases(pg_server, pg_url):
    other = pg_server.new_database()
    assert other != pg_url
    write(pg_url, "only-in-first")
    assert not has_items(other)
    write(other, "only-in-second")
    assert names(pg_url) == ["only-in-first"]
    assert names(other) == ["only-in-second"]
    pg_server.drop_database(other)


def test_restart_keeps_the_port_and_the_data(pg_server, pg_url):
    write(pg_url, "before")
    engine = sa.create_engine(pg_url, pool_pre_ping=True)
    try:
        with engine.connect() as conn:  # a pooled session, cut by the restart
            assert conn.scalar(sa.text("SELECT count(*) FROM items")) == 1
        pid, port = pg_server.proc.pid, pg_server.port
        pg_server.restart()
        assert pg_server.proc.pid != pid and pg_server.port == port
        with engine.begin() as conn:  # pre-ping replaces the dead pooled connection
            conn.execute(sa.insert(ITEMS), [{"name": "after"}])
    finally:
        engine.dispose()
    assert names(pg_url) == ["before", "after"]


def test_a_crash_loses_no_committed_row(pg_server, pg_url):
    """kill() is an immediate shutdown: no checkpoint, so the restart replays the WAL."""
    write(pg_url, "committed")
    pg_server.kill()
    assert not pg_server.running
    pg_server.start()
    assert names(pg_url) == ["committed"]


def test_missing_binaries_say_which_package_to_install(monkeypatch, tmp_path):
    from tests.support.pgserver import PgUnavailable, find_bindir

    monkeypatch.setenv("FRT_PG_BINDIR", str(tmp_path))  # a directory without initdb and postgres
    try:
        find_bindir()
    except PgUnavailable as e:
        assert "install Debian's `postgresql` package" in str(e)
    else:
        raise AssertionError("find_bindir accepted a directory without the PostgreSQL binaries")
