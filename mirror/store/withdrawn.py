"""Withdrawals remembered: which staged rows were taken away and when, so that importing a bundle written
before then does not bring them back (issue: an older full bundle re-imported resurrected relu v2).

The time is the deciding box's clock: `unstage` records its own now; an incremental bundle's removal
records the bundle's `created` (the connected box wrote it after the unstage). A bundle is compared by its
own `created`, so both sides of the gap read one clock, the connected box's, except for an unstage run on
the cluster itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from sqlalchemy import select, tuple_
from sqlalchemy.orm import Session

from frt.resolver.ledger import Ledger

from ..schema import Withdrawn

Key = tuple[str, str, str]  # (repo, requested, target), a staged row's key


def record_withdrawn(s: Session, keys: Iterable[Key], at: datetime) -> None:
    """In the caller's write: these rows were withdrawn at `at` (a later time replaces an earlier one)."""
    for repo, requested, target in sorted(set(keys)):
        row = s.get(Withdrawn, (repo, requested, target))
        if row is None:
            s.add(Withdrawn(repo_id=repo, requested=requested, target=target, at=at))
        elif _naive(row.at) < _naive(at):
            row.at = at


def withdrawn_after(ledger: Ledger, keys: Iterable[Key], created: datetime) -> dict[Key, datetime]:
    """Of `keys`, those withdrawn here after `created` (a bundle's time), with when."""
    keys = sorted(set(keys))
    out: dict[Key, datetime] = {}
    with ledger.session(write=False) as s:
        for i in range(0, len(keys), 300):
            q = select(Withdrawn).where(
                tuple_(Withdrawn.repo_id, Withdrawn.requested, Withdrawn.target).in_(keys[i : i + 300])
            )
            for w in s.scalars(q):
                if _naive(w.at) > _naive(created):
                    out[(w.repo_id, w.requested, w.target)] = w.at
    return out


def forget_withdrawn(s: Session, keys: Iterable[Key]) -> None:
    """Staged again (a newer bundle, or --allow-rollback): no longer withdrawn."""
    for key in set(keys):
        row = s.get(Withdrawn, key)
        if row is not None:
            s.delete(row)


def _naive(dt: datetime) -> datetime:
    """UTC without tzinfo: SQLite hands back naive datetimes, a bundle's `created` parses aware."""
    return dt.replace(tzinfo=None) if dt.tzinfo is not None else dt
