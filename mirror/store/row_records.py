"""The ledger's records beside the blobs: what `frt-mirror ledger rebuild` makes a lost ledger from.

Every write of staged rows (stage, import, pull-through: records.record_staged_rows) first writes into the
store one record per row: a JSON document in a bundle's manifest format (bundle/format.py), holding the row
and everything a client's answer for it reads — its repo's rows as the ledger has them (refs, the history
listings, every commit with its build listing), the blobs of its variant's files and wheels (sha256, size,
git oid), those wheels, and its org's publisher answer as recorded. A bundle's format because a bundle is
already that: what a ledger on the other side of an air gap answers identically from, checked by one reader
(bundle/check.py), which the rebuild reuses.

A record is named by the sha256 of its row's key (repo, requested, target), the ledger's own key for a
staged row: staging the row again replaces its record, one rename or one PUT, so a write is idempotent and
whole; two stagers of different rows never write the same name. An unstage (delete_staged) replaces the
record with a tombstone that says when, so a rebuilt ledger neither stages the row again nor forgets it was
withdrawn (an older bundle's import must not bring it back).

Records are written before the ledger's transaction commits: a record exists for every staged row. A
crash between the two leaves a record whose row never committed; a rebuild stages it, which is what the
stager was doing (its blobs were stored and verified before the record was written). gc removes the records
of rows the ledger does not stage, so such a record does not outlive the ledger that could judge it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import frt
from frt.resolver.errors import LedgerCorrupt
from frt.resolver.ledger import Ledger
from frt.resolver.ledger.io import repo_record
from frt.resolver.ledger.migrations import utcnow
from frt.resolver.resolution import FileEntry

from .blob_reads import recorded_blobs, sha256_by_git_oid, wheel_rows
from .blobs import Digest, listed_blobs
from .protocol import BlobStore
from .staged import StagedRow

BUNDLE_FORMAT, WHEELS_FORMAT = 3, 5  # bundle/format.py's FORMAT and WHEELS (the store may not import bundle)
Key = tuple[str, str, str]  # (repo, requested, target)


def record_name(key: Key) -> str:
    return hashlib.sha256(json.dumps(list(key)).encode()).hexdigest() + ".json"


def write_row_records(ledger: Ledger, store: BlobStore, rows: Iterable[StagedRow]) -> None:
    """One record per row, from what the ledger holds now (inside the caller's transaction, where there is
    one: an import's repos are not committed yet)."""
    for row, doc in row_documents(ledger, list(rows)).items():
        store.put_record(record_name(row.key), _dump(doc))


def write_withdrawals(store: BlobStore, keys: Iterable[Key], at: datetime) -> None:
    """Tombstones for rows being unstaged: each replaces the row's record."""
    for repo, requested, target in sorted(set(keys)):
        doc = {"withdrawn": {"repo": repo, "requested": requested, "target": target, "at": at.isoformat()}}
        store.put_record(record_name((repo, requested, target)), _dump(doc))


def drop_orphans(store: BlobStore, staged: Iterable[Key]) -> int:
    """Remove the records of rows the ledger does not stage that are not tombstones: rows whose stage was cut
    between its record and its commit. gc calls this holding the store's lock (no stager is between the two),
    before it removes their blobs: a record naming a blob gc took would stop a rebuild. How many it removed."""
    keep, dropped = {record_name(k) for k in staged}, 0
    for name in store.record_names():
        if name in keep:
            continue
        try:
            tombstone = "withdrawn" in json.loads(store.read_record(name))
        except ValueError:  # damaged: left for the rebuild to name, not guessed at here
            continue
        if not tombstone:
            store.drop_record(name)
            dropped += 1
    return dropped


def _dump(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def row_documents(ledger: Ledger, rows: list[StagedRow]) -> dict[StagedRow, dict[str, Any]]:
    """Each row's record, as a full bundle's manifest of that row alone."""
    if not rows:
        return {}
    # Only reads that join the caller's transaction (a session, not Ledger.view's own connection).
    repos = {repo: repo_record(ledger, repo) for repo in sorted({r.repo for r in rows})}
    listings = {
        (repo, c["sha"], v["name"]): [FileEntry(f["path"], f["size"], f["git_oid"], f["sha256"]) for f in v["files"]]
        for repo, rec in repos.items()
        for c in rec["commits"]
        for v in c["variants"] or ()
    }
    wheels = wheel_rows(ledger, {w for r in rows for w in r.wheels})
    entries = [f for r in rows for f in listings.get((r.repo, r.commit, r.variant), ())]
    blobs = listed_blobs(entries, sha256_by_git_oid(ledger, [f.git_oid for f in entries if not f.sha256]))
    digests = recorded_blobs(ledger, [sha for sha in blobs.values() if sha] + [w[2] for w in wheels.values()])
    publishers = ledger.publishers({r.repo.split("/", 1)[0] for r in rows})
    created = utcnow().isoformat()
    out = {}
    for r in rows:
        files = listings.get((r.repo, r.commit, r.variant))
        if not files:
            raise LedgerCorrupt(f"staged {r.repo}@{r.commit[:12]} {r.variant} has no build listing in the ledger")
        needed = [_digest(digests, blobs[f], f"{r.repo}: {f.path}") for f in files]
        needed += [_digest(digests, wheels[w][2], f"wheel {w}") for w in r.wheels]
        org = publishers.get(r.repo.split("/", 1)[0])
        out[r] = {
            "format": WHEELS_FORMAT if r.wheels else BUNDLE_FORMAT,
            "created": created,
            "frt_mirror": frt.version(),
            "blobs": [
                {"sha256": d.sha256, "size": d.size, "git_oid": d.git_oid}
                for d in sorted(set(needed), key=lambda d: d.sha256)
            ],
            "repos": [repos[r.repo]],
            "staged": [r.to_json()],
            "publishers": [org.to_json()] if org is not None else [],
        }
        if r.wheels:
            out[r]["wheels"] = [
                {"filename": w, "project": p, "version": v, "sha256": sha, "size": size}
                for w in sorted(r.wheels)
                for p, v, sha, size in [wheels[w]]
            ]
    return out


def _digest(recorded: dict[str, Digest], sha: str | None, what: str) -> Digest:
    if sha is None or sha not in recorded:
        raise LedgerCorrupt(f"{what} has no recorded blob: a staged row's files are recorded before the row")
    return recorded[sha]
