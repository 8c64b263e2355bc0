"""The home's events log: what was staged, bundled, imported or collected, and when (schema.Event)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select

from frt.resolver.ledger import Ledger
from frt.resolver.ledger.retry import retried

from .event_rows import QUARANTINE as QUARANTINE
from .event_rows import EventRow as EventRow
from .schema import Event


@retried
def record_event(
    ledger: Ledger,
    kind: str,
    *,
    ref: str | None = None,
    base: str | None = None,
    files: int = 0,
    nbytes: int = 0,
    detail: str = "",
) -> None:
    with ledger.session(write=True) as s:
        s.add(Event(kind=kind, ref=ref, base=base, files=files, nbytes=nbytes, detail=detail))


@retried
def last_events(ledger: Ledger) -> dict[str, EventRow]:
    """The newest event of each kind."""
    newest = select(Event.kind, func.max(Event.id).label("id")).group_by(Event.kind).subquery()
    q = select(Event).join(newest, Event.id == newest.c.id)
    with ledger.session(write=False) as s:
        return {e.kind: _row(e) for e in s.scalars(q)}


@retried
def events_with_ref(ledger: Ledger, kind: str, ref: str) -> list[EventRow]:
    """Every event of `kind` naming `ref`, oldest first (e.g. the imports of one bundle)."""
    q = select(Event).where(Event.kind == kind, Event.ref == ref).order_by(Event.id)
    with ledger.session(write=False) as s:
        return [_row(e) for e in s.scalars(q)]


@retried
def events_of(ledger: Ledger, kind: str) -> list[EventRow]:
    """Every event of `kind`, oldest first."""
    q = select(Event).where(Event.kind == kind).order_by(Event.id)
    with ledger.session(write=False) as s:
        return [_row(e) for e in s.scalars(q)]


@retried
def pulled_by_repo(ledger: Ledger) -> dict[str, tuple[int, int, datetime]]:
    """What pull-through fetched, per repo: files, bytes, and when last (its "pull" events name repo@commit)."""
    q = select(Event.ref, func.sum(Event.files), func.sum(Event.nbytes), func.max(Event.at)).where(Event.kind == "pull")
    out: dict[str, tuple[int, int, datetime]] = {}
    with ledger.session(write=False) as s:
        for ref, files, nbytes, at in s.execute(q.group_by(Event.ref)):
            repo = (ref or "").rpartition("@")[0]
            f0, b0, a0 = out.get(repo, (0, 0, at))
            out[repo] = (f0 + int(files or 0), b0 + int(nbytes or 0), max(a0, at))
    return out


def _row(e: Event) -> EventRow:
    return EventRow(e.kind, e.at, e.ref, e.base, e.files, e.nbytes, e.detail)
