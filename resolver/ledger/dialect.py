"""The one SQL construct the ledger's dialects spell differently: INSERT … ON CONFLICT (an upsert).

SQLite and PostgreSQL share the syntax and SQLAlchemy gives each its own `insert()`; statements are
built per dialect of the connection that runs them, and cached (building one costs more than running it)."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import TypeVar

from sqlalchemy import Connection
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

S = TypeVar("S")
# `insert(table)` of a dialect: both dialects' Inserts have on_conflict_do_nothing/do_update and `excluded`.
InsertFn = Callable[..., postgresql.Insert | sqlite.Insert]


def insert_for(bind: Connection | Session) -> InsertFn:
    """`insert()` with on_conflict_do_nothing/do_update, for the dialect of `bind` (a Connection or Session)."""
    dialect = bind.dialect if hasattr(bind, "dialect") else bind.get_bind().dialect
    return postgresql.insert if dialect.name == "postgresql" else sqlite.insert


def cached(build: Callable[[InsertFn], S]) -> Callable[[Connection | Session], S]:
    """A statement built once per dialect by `build(insert)`, looked up by the bind that runs it."""
    per_dialect = lru_cache(maxsize=None)(build)
    return lambda bind: per_dialect(insert_for(bind))
