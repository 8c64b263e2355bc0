"""Scan: copy what upstream has for a repo into the ledger, incrementally.

Refs are always refreshed (one request). A branch's history is fetched only when
its head is a commit the ledger has not placed in history yet, and a commit's
build/ listing only once: commits are immutable. `metadata.json` files are fetched
by git oid, so a file unchanged across commits is fetched once.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from .gate import check_repo_id
from .hub import HubClient
from .ledger import Ledger
from .ledger.retry import retried
from .ledger.schema import Listing, Repo
from .resolution import FileEntry, VariantInfo
from .wire import TooLarge

# Listing rows per ledger write: a few seconds on a slow disk, far inside the busy timeout (30 s).
ROWS_PER_WRITE = 5_000


@dataclass(frozen=True)
class ScanReport:
    repo: str
    refs: int
    commits: int
    commits_scanned: int
    variants: int


def scan(
    repo_id: str,
    *,
    hub: HubClient,
    ledger: Ledger,
    jobs: int = 8,
    repo_type: str = "kernel",
    extra_revisions: tuple[str, ...] = (),
    progress: Callable[[str], None] | None = None,
    heads_only: bool = False,
) -> ScanReport:
    """`heads_only`: list build/ of the refs' heads (and `extra_revisions`) only, not of every commit in
    their history: what a pull-through mirror needs to answer a client now, one listing per new head."""
    check_repo_id(repo_id)
    refs = hub.refs(repo_id, repo_type)
    ledger.record_refs(repo_id, refs, endpoint=hub.endpoint, repo_type=repo_type)
    if repo_type == "kernel":
        _record_publisher(repo_id.split("/", 1)[0], hub=hub, ledger=ledger)
    heads = sorted(set(refs.values()))
    for rev in extra_revisions:
        heads.append(hub.revision_sha(repo_id, rev, repo_type))
    for head in heads_without_history(ledger, repo_id, heads):
        ledger.record_history(repo_id, head, hub.history(repo_id, head, repo_type))

    todo = ledger.unscanned_commits(repo_id)
    if heads_only:
        todo = [sha for sha in todo if sha in set(heads)]
    if progress and todo:
        progress(f"{repo_id}: listing build/ of {len(todo)} commit(s)")
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        listings = dict(zip(todo, pool.map(lambda sha: hub.build_listing(repo_id, sha, repo_type), todo), strict=False))
        metadata = _fetch_metadata(repo_id, listings, hub=hub, ledger=ledger, pool=pool, repo_type=repo_type)
        builds = {
            sha: [_variant_info(name, files, metadata) for name, files in sorted(listing.items())]
            for sha, listing in listings.items()
        }
    _record_builds(ledger, repo_id, builds)
    variants_found = sum(len(v) for v in builds.values())
    return ScanReport(repo_id, len(refs), _commit_count(ledger, repo_id), len(todo), variants_found)


def _record_builds(ledger: Ledger, repo_id: str, builds: dict[str, list[VariantInfo]]) -> None:
    """The listings, a few commits per write. A write holds the ledger's one write lock while it runs:
    a whole history in one transaction (or one hostile listing of 100k entries: ~40 s) held it past the
    busy timeout, and every other writer (another stager, serve's pull-through) failed with "locked by
    another process". Each commit is marked scanned in the write that records its rows, so a run cut
    between two writes keeps what it wrote and lists only the rest again. A single listing is bounded
    by FRT_MAX_LISTING_ENTRIES (wire.Limits)."""
    batch: dict[str, list[VariantInfo]] = {}
    rows = 0
    for sha, variants in builds.items():
        n = len(variants) + sum(len(v.files) for v in variants)
        if batch and rows + n > ROWS_PER_WRITE:
            ledger.record_builds(repo_id, batch)
            batch, rows = {}, 0
        batch[sha], rows = variants, rows + n
    if batch:
        ledger.record_builds(repo_id, batch)


@retried
def _commit_count(ledger: Ledger, repo_id: str) -> int:
    with ledger.view() as v:
        return v.commit_count(repo_id)


def _record_publisher(org: str, *, hub: HubClient, ledger: Ledger) -> None:
    """What the upstream says of the org's trust, kept so `serve` and bundles repeat exactly that."""
    trusted = hub.publisher_trusted(org)
    if trusted is not None:
        ledger.record_publisher(org, trusted, endpoint=hub.endpoint)


@retried
def heads_without_history(ledger: Ledger, repo_id: str, heads: list[str]) -> list[str]:
    """Heads whose listing is not recorded. A commit's history never changes, so a listing once
    recorded is kept; a new head (a push) is asked for its own."""
    with ledger.session(write=False) as s:
        listed = set(
            s.scalars(
                select(Listing.head).join(Repo).where(Repo.repo_id == repo_id, Listing.head.in_(heads)).distinct()
            )
        )
    return [h for h in dict.fromkeys(heads) if h not in listed]


def _metadata_file(files: list[FileEntry]) -> FileEntry | None:
    return next((f for f in files if f.path.count("/") == 2 and f.path.endswith("/metadata.json")), None)


def _fetch_metadata(
    repo_id: str,
    listings: dict[str, dict[str, list[FileEntry]]],
    *,
    hub: HubClient,
    ledger: Ledger,
    pool: Executor,
    repo_type: str,
) -> dict[str, dict[str, Any] | None]:
    """metadata.json contents by git oid: from the ledger if seen before, else from upstream."""
    wanted: dict[str, tuple[FileEntry, str]] = {}  # oid -> (the file, the commit to fetch it from)
    for sha, listing in listings.items():
        for files in listing.values():
            meta = _metadata_file(files)
            if meta is not None:
                wanted.setdefault(meta.git_oid, (meta, sha))
    known: dict[str, dict[str, Any] | None] = dict(ledger.known_metadata(set(wanted)))
    missing = [oid for oid in wanted if oid not in known]

    def fetch(oid: str) -> dict[str, Any] | None:
        entry, sha = wanted[oid]
        try:  # read to its listed size at most: more is not the file the listing names either
            raw = hub.fetch_small_file(repo_id, entry.path, sha, repo_type, size=entry.size)
        except TooLarge:
            return None
        if _git_blob_oid(raw) != oid:  # not the file the listing names: never read as the publisher's word
            return None
        hub.small.remember(oid, raw)  # its bytes as checked: a stage in this run stores them without a second GET
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError):  # not JSON, or nested past what a parser should follow
            return None  # recorded as variant without metadata; resolve still sees the variant
        return doc if isinstance(doc, dict) else None

    known.update(zip(missing, pool.map(fetch, missing), strict=False))
    return known


def _git_blob_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _variant_info(name: str, files: list[FileEntry], metadata: dict[str, dict[str, Any] | None]) -> VariantInfo:
    meta = _metadata_file(files)
    return VariantInfo(name, tuple(files), meta.git_oid if meta else None, metadata.get(meta.git_oid) if meta else None)
