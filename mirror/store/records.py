"""The mirror's rows in the ledger: which blobs are stored, and what is staged for which target."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, select, tuple_
from sqlalchemy.orm import Session

from frt.resolver.archs import Declared
from frt.resolver.ledger import Ledger
from frt.resolver.ledger.dialect import insert_for
from frt.resolver.ledger.migrations import utcnow
from frt.resolver.ledger.retry import retried
from frt.resolver.ledger.schema import Repo
from frt.resolver.resolution import FileEntry, Resolution

from ..schema import Blob, Change, Staged, StagedWheel, Wheel
from .blob_reads import in_batches
from .blob_reads import recorded_blobs as recorded_blobs
from .blob_reads import sha256_by_git_oid as sha256_by_git_oid
from .blob_reads import wheel_rows as wheel_rows
from .blobs import Digest, listed_blobs
from .protocol import BlobStore
from .row_records import write_row_records, write_withdrawals
from .staged import MODEL_SELECTION as MODEL_SELECTION
from .staged import MODEL_TARGET as MODEL_TARGET
from .staged import PULLED as PULLED
from .staged import StagedRow as StagedRow


@dataclass(frozen=True)
class WheelRecord:
    """A wheel in the store: what pip installs on a cluster for a kernel's python-depends."""

    filename: str
    project: str
    version: str
    sha256: str
    size: int


@retried
def record_blobs(ledger: Ledger, digests: Iterable[Digest]) -> None:
    rows = [{"sha256": d.sha256, "size": d.size, "git_oid": d.git_oid, "stored_at": utcnow()} for d in digests]
    if rows:
        with ledger.session() as s:
            s.execute(insert_for(s)(Blob).on_conflict_do_nothing(), rows)


def blob_for(ledger: Ledger, entries: Iterable[FileEntry]) -> dict[FileEntry, str | None]:
    """Which stored blob each listed file is (its sha256), or None where none is recorded (blobs.listed_blobs)."""
    entries = list(entries)
    return listed_blobs(entries, sha256_by_git_oid(ledger, [f.git_oid for f in entries if not f.sha256]))


@retried
def all_blobs(ledger: Ledger) -> list[Digest]:
    with ledger.session(write=False) as s:
        return [
            Digest(sha, oid, size)
            for sha, oid, size in s.execute(select(Blob.sha256, Blob.git_oid, Blob.size).order_by(Blob.sha256))
        ]


def record_staged(
    ledger: Ledger,
    resolutions: Iterable[Resolution],
    wheels: dict[tuple[str, str, str, str], tuple[str, ...]] | None = None,
    *,
    store: BlobStore | None,
) -> None:
    """`wheels`: per resolution's (repo, commit, variant, target) the filenames of its wheels."""
    wheels = wheels or {}
    record_staged_rows(
        ledger,
        [
            StagedRow(
                r.repo,
                r.request.label,
                r.request.version,
                r.request.revision,
                str(r.target),
                r.commit,
                r.variant,
                wheels.get((r.repo, r.commit, r.variant, str(r.target)), ()),
            )
            for r in resolutions
        ],
        store=store,
    )


@retried
def record_staged_rows(ledger: Ledger, staged: Iterable[StagedRow], *, store: BlobStore | None) -> None:
    """Stage `staged` in the ledger, their records written into `store` first (row_records.py: what a lost
    ledger is rebuilt from). `store` None: no records written (the rebuild, which reads them)."""
    staged = list(staged)
    if store is not None:
        write_row_records(ledger, store, staged)
    rows = [
        {
            "repo_id": r.repo,
            "requested": r.requested,
            "version": r.version,
            "revision": r.revision,
            "target": r.target,
            "commit_sha": r.commit,
            "variant": r.variant,
            "staged_at": utcnow(),
        }
        for r in staged
    ]
    if not rows:
        return
    with ledger.session() as s:
        stmt = insert_for(s)(Staged)
        s.execute(
            stmt.on_conflict_do_update(
                index_elements=["repo_id", "requested", "target"],
                set_={
                    "commit_sha": stmt.excluded.commit_sha,
                    "variant": stmt.excluded.variant,
                    "staged_at": stmt.excluded.staged_at,
                },
            ),
            rows,
        )
        _delete_wheel_links(s, [r.key for r in staged])
        links = [
            {"repo_id": r.repo, "requested": r.requested, "target": r.target, "filename": w}
            for r in staged
            for w in r.wheels
        ]
        if links:
            s.execute(insert_for(s)(StagedWheel).on_conflict_do_nothing(), links)
        bump_serial(s)


def bump_serial(s: Session) -> None:
    """In the caller's write: what serve answers changed (see schema.Change)."""
    stmt = insert_for(s)(Change).values(id=1, serial=1)
    s.execute(stmt.on_conflict_do_update(index_elements=["id"], set_={"serial": Change.serial + 1}))


@retried
def change_serial(ledger: Ledger) -> int:
    """The serial as of now (0: nothing was ever staged or changed). One primary-key read."""
    with ledger.session(write=False) as s:
        return s.scalar(select(Change.serial).where(Change.id == 1)) or 0


@retried
def staged_rows(ledger: Ledger, target: str | None = None) -> list[StagedRow]:
    q = select(Staged).order_by(Staged.repo_id, Staged.version, Staged.requested, Staged.target)
    if target is not None:
        q = q.where(Staged.target == target)
    with ledger.session(write=False) as s:
        wheels: dict[tuple[str, str, str], list[str]] = {}
        for repo, requested, tgt, filename in s.execute(
            select(StagedWheel.repo_id, StagedWheel.requested, StagedWheel.target, StagedWheel.filename).order_by(
                StagedWheel.filename
            )
        ):
            wheels.setdefault((repo, requested, tgt), []).append(filename)
        return [
            StagedRow(
                r.repo_id,
                r.requested,
                r.version,
                r.revision,
                r.target,
                r.commit_sha,
                r.variant,
                tuple(wheels.get((r.repo_id, r.requested, r.target), ())),
            )
            for r in s.scalars(q)
        ]


def _delete_wheel_links(s: Session, keys: list[tuple[str, str, str]]) -> None:
    row = tuple_(StagedWheel.repo_id, StagedWheel.requested, StagedWheel.target)
    for batch in in_batches(keys, 300):
        s.execute(delete(StagedWheel).where(row.in_(batch)))


@retried
def record_wheels(ledger: Ledger, wheels: Iterable[WheelRecord]) -> None:
    """Wheels now in the store."""
    rows = [
        {"filename": w.filename, "project": w.project, "version": w.version, "sha256": w.sha256, "size": w.size}
        for w in wheels
    ]
    if rows:
        with ledger.session() as s:
            s.execute(insert_for(s)(Wheel).on_conflict_do_nothing(), rows)


@retried
def repo_types(ledger: Ledger, rows: Iterable[StagedRow]) -> dict[StagedRow, str]:
    """Each row's repo type as a client names it: kernel, or for a target-less row what the ledger
    recorded of its repo (a model, or a dataset pulled through)."""
    rows = list(rows)
    with ledger.session(write=False) as s:
        recorded = dict(
            s.execute(
                select(Repo.repo_id, Repo.repo_type).where(Repo.repo_id.in_({r.repo for r in rows if r.is_model}))
            ).all()
        )

    def kind(r: StagedRow) -> str:
        if not r.is_model:
            return "kernel"
        return recorded[r.repo] if recorded.get(r.repo) in ("model", "dataset") else "model"

    return {r: kind(r) for r in rows}


def staged_for(ledger: Ledger, target: str | None) -> list[StagedRow]:
    """What is staged for `target`: its own rows, and each pulled-through request's best variant that the
    target accepts, unless the target has its own row for that request."""
    rows = staged_rows(ledger, target)
    if target is None or not target.startswith("torch"):
        return rows
    from frt.resolver.targets import parse_target
    from frt.resolver.variants import accepted

    t, own = parse_target(target), {(r.repo, r.requested) for r in rows}
    pulled: dict[tuple[str, str, str], list[StagedRow]] = {}
    for r in staged_rows(ledger):
        if r.is_pulled and (r.repo, r.requested) not in own:
            pulled.setdefault((r.repo, r.requested, r.commit), []).append(r)
    chosen = []
    for (repo, _, commit), group in pulled.items():
        best = accepted(t, [r.variant for r in group], _declared(ledger, repo, commit) if t.archs else None)
        chosen += [r for r in group if best and r.variant == best[0]]
    if not chosen:
        return rows
    return sorted(rows + chosen, key=lambda r: (r.repo, r.version or 0, r.requested, r.target))


@retried
def _declared(ledger: Ledger, repo: str, commit: str) -> dict[str, Declared]:
    with ledger.view() as v:
        return v.declared(repo, commit)


@retried
def delete_blob_records(ledger: Ledger, shas: Iterable[str]) -> None:
    """Forget blobs gc is about to remove (before their files go: a record never claims bytes the
    store lacks, and a file left by a gc cut short is only an unrecorded blob, which verify adopts)."""
    shas = sorted(set(shas))
    if shas:
        with ledger.session() as s:
            for batch in in_batches(shas):
                s.execute(delete(Blob).where(Blob.sha256.in_(batch)))


@retried
def delete_staged(
    ledger: Ledger, rows: Iterable[StagedRow], *, store: BlobStore | None, at: datetime | None = None
) -> None:
    """Drop staged rows (unstage), in one write that tells serve's replicas and remembers them as withdrawn
    at `at` (default now; withdrawn.py); their records in `store` become tombstones first (row_records.py)."""
    from .withdrawn import record_withdrawn

    keys = sorted({r.key for r in rows})
    at = at or utcnow()
    if keys and store is not None:
        write_withdrawals(store, keys, at)
    if keys:
        with ledger.session() as s:
            for batch in in_batches(keys, 300):
                s.execute(delete(Staged).where(tuple_(Staged.repo_id, Staged.requested, Staged.target).in_(batch)))
            _delete_wheel_links(s, keys)
            record_withdrawn(s, keys, at)
            bump_serial(s)


@retried
def variant_files(ledger: Ledger, keys: list[tuple[str, str, str]]) -> list[FileEntry]:
    """The files of each (repo, commit, variant) in `keys`, as its listing names them."""
    with ledger.view() as v:
        return [f for key in keys for f in v.variant(*key)[0]]
