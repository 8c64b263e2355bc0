"""The ledger's reads of stored blobs and wheels that both records.py and row_records.py make (one place,
no cycle between the two)."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Sequence
from typing import TypeVar

from sqlalchemy import select

from frt.resolver.ledger import Ledger
from frt.resolver.ledger.retry import retried

from ..schema import Blob, Wheel
from .blobs import Digest

K = TypeVar("K", bound=Hashable)  # a key of an IN list: a sha, or a (repo, requested, target) row


@retried
def sha256_by_git_oid(ledger: Ledger, oids: Iterable[str]) -> dict[str, str]:
    """Stored blobs known by git oid: small files advertise only that, not their sha256."""
    out: dict[str, str] = {}
    with ledger.session(write=False) as s:
        for batch in in_batches(list(set(oids))):
            out.update(s.execute(select(Blob.git_oid, Blob.sha256).where(Blob.git_oid.in_(batch))).all())
    return out


def in_batches(keys: Sequence[K], n: int = 500) -> Iterator[Sequence[K]]:
    """`keys`, `n` at a time, in their order: an IN list of each stays under every database's bound on
    parameters (SQLite's was 999); deletes take their rows' locks in one order (sorted by the caller)."""
    for i in range(0, len(keys), n):
        yield keys[i : i + n]


@retried
def recorded_blobs(ledger: Ledger, shas: Iterable[str]) -> dict[str, Digest]:
    """The ledger's record of these stored blobs (sha256, content git oid, size), where it has one."""
    out: dict[str, Digest] = {}
    with ledger.session(write=False) as s:
        for batch in in_batches(list(set(shas))):
            rows = s.execute(select(Blob.sha256, Blob.git_oid, Blob.size).where(Blob.sha256.in_(batch)))
            out.update((sha, Digest(sha, oid, size)) for sha, oid, size in rows)
    return out


@retried
def wheel_rows(ledger: Ledger, filenames: Iterable[str] | None = None) -> dict[str, tuple[str, str, str, int]]:
    """filename -> (project, version, sha256, size) of the recorded wheels (these, or all)."""
    q = select(Wheel.filename, Wheel.project, Wheel.version, Wheel.sha256, Wheel.size).order_by(Wheel.filename)
    if filenames is not None:
        q = q.where(Wheel.filename.in_(sorted(set(filenames))))
    with ledger.session(write=False) as s:
        return {f: (p, v, sha, size) for f, p, v, sha, size in s.execute(q)}
