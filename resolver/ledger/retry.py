"""Riding out a ledger server that drops its connections: a restart (`pg_ctl restart`: "terminating
connection due to administrator command", then refused connections until it is back), a failover, an
admin's pg_terminate_backend.

The unit retried is a callable, never a `with` block: a context manager cannot run its body again. Each
unit begins and ends its own transactions, so a retry re-runs a whole transaction from its start on a
fresh connection (SQLAlchemy empties the pool on a disconnect), never the rest of a half-committed one.
Inside a `Ledger.transaction`, or inside another retried unit, a unit runs once and its failure goes
up: the outermost unit is the one re-run.

Only the writer commands ride it out (stage, import, gc, unstage, scan: `riding_out`), for at most
FRT_LEDGER_RETRY_S. Everything else fails at once, as before: serve answers 503 and keeps what it has,
and a resolve says "try again later" rather than hang a minute. SQLite's "database is locked" is not
this: it already waits out the busy timeout.
"""

from __future__ import annotations

import contextlib
import functools
import random
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Concatenate, ParamSpec, Protocol, TypeVar

from sqlalchemy.exc import DBAPIError, OperationalError

from ..errors import LedgerDropped, LedgerUnavailable, first_line
from ..settings import env_number

T = TypeVar("T")
P = ParamSpec("P")

FIRST_WAIT_S, MAX_WAIT_S = 0.1, 2.0

# admin_shutdown, crash_shutdown, cannot_connect_now (starting up, shutting down); class 08 is
# connection_exception.
_DROPPED_STATES = {"57P01", "57P02", "57P03"}
# What libpq says, with no SQLSTATE, when the connection itself is lost or cannot be made yet.
_DROPPED_TEXT = (
    "server closed the connection unexpectedly",
    "connection refused",
    "terminating connection",
    "the database system is",
    "could not receive data from server",
    "connection reset",
    "the connection is lost",
    "the connection is closed",
    "no such file or directory",
)

# Whether ledgers opened in this context are a writer command's, which rides out a restart.
_RIDING_OUT: ContextVar[bool] = ContextVar("frt_ledger_riding_out", default=False)


@contextlib.contextmanager
def riding_out() -> Iterator[None]:
    """Ledgers opened inside retry what a dropped connection cut (see the module). Scoped, not set for good:
    a writer command run in a process that goes on (click's CliRunner, a caller of the CLI's group) must
    not leave the readers that follow it riding out a restart for a minute."""
    token = _RIDING_OUT.set(True)
    try:
        yield
    finally:
        _RIDING_OUT.reset(token)


def retry_budget() -> float:
    """Seconds a ledger opened here retries dropped connections for: FRT_LEDGER_RETRY_S (default 60)
    in a writer command, else 0 (fail at once)."""
    return env_number("FRT_LEDGER_RETRY_S", 60.0) if _RIDING_OUT.get() else 0.0


def dropped(e: BaseException) -> bool:
    """Whether a server's error is the connection lost or refused, which a fresh one may not meet, rather
    than anything about the statement (a constraint, a lock timeout, a bad password)."""
    if not isinstance(e, DBAPIError):
        return False
    if e.connection_invalidated:
        return True
    state = getattr(e.orig, "sqlstate", None) or ""
    if state in _DROPPED_STATES or state.startswith("08"):
        return True
    text = str(e.orig).lower()
    return isinstance(e, OperationalError) and not state and any(t in text for t in _DROPPED_TEXT)


def run_retrying(unit: Callable[[], T], *, budget: float, where: str, before_retry: Callable[[], None]) -> T:
    """`unit()`, run again after a jittered wait (0.1 s doubling to 2 s) while it fails on a dropped
    connection, for at most `budget` seconds from its first failure; then one line naming the ledger.
    `before_retry` runs first in each retry, as part of it (re-taking the named locks a restart dropped)."""
    deadline, wait = None, FIRST_WAIT_S
    while True:
        try:
            if deadline is not None:
                before_retry()
            return unit()
        except (LedgerDropped, DBAPIError) as e:
            if isinstance(e, DBAPIError) and not dropped(e):
                raise
            now = time.monotonic()
            deadline = now + budget if deadline is None else deadline
            if now >= deadline:
                raise LedgerUnavailable(_gave_up(e, where, budget)) from None
            time.sleep(min(random.uniform(wait / 2, wait), deadline - now))
            wait = min(2 * wait, MAX_WAIT_S)


def _gave_up(e: BaseException, where: str, budget: float) -> str:
    text = str(e) if isinstance(e, LedgerUnavailable) else f"ledger {where} is unavailable: {first_line(e)}"
    return f"{text} (still, after retrying for {budget:g} s: FRT_LEDGER_RETRY_S)"


class _Retrying(Protocol):
    """What `retried` needs of a ledger (Ledger, which imports this module)."""

    def retrying(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T: ...


L = TypeVar("L", bound=_Retrying)


def retried(fn: Callable[Concatenate[L, P], T]) -> Callable[Concatenate[L, P], T]:
    """A function of a ledger (its first argument, `self` for a method), as one retried unit."""

    @functools.wraps(fn)
    # `ledger` positional-only, as Concatenate has it: a keyword of P may then be named "ledger" too.
    def unit(ledger: L, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return ledger.retrying(fn, ledger, *args, **kwargs)

    return unit
