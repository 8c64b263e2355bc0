"""Scan: copy what upstream has for a repo into the ledger, incrementally.

Refs are always refreshed (one request). A branch's history is fetched only when
its head is a commit the ledger has not placed in history yet, and a commit's
build/ listing only once: commits are immutable; each is recorded as it arrives.
`metadata.json` files are fetched by git oid, so a file unchanged across commits is
fetched once.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Executor, ThreadPoolExecutor, wait
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from .gate import check_repo_id
from .hub import HubClient, RevisionNotFound
from .ledger import Ledger
from .ledger.retry import retried
from .ledger.schema import Listing, Repo
from .once import Once
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
    reach: tuple[str, ...] = (),
    progress: Callable[[str], None] | None = None,
    heads_only: bool = False,
    pool: Executor | None = None,
) -> ScanReport:
    """`extra_revisions`: heads of their own besides the refs' (bisect's ends, a sha a client named to a
    pull-through mirror): each asked of the upstream, its history listed. `reach`: revisions a request
    names (a pinned sha): asked of the upstream only when no ref's history reaches them; one the upstream
    does not know is left for the resolver to refuse. `heads_only`: list build/ of the heads only, not of
    every commit in their history: what a pull-through mirror needs to answer a client now. `pool`: the
    listings' threads, shared by the scans of one run (else `jobs` of this scan's own)."""
    check_repo_id(repo_id)
    refs = hub.refs(repo_id, repo_type)
    ledger.record_refs(repo_id, refs, endpoint=hub.endpoint, repo_type=repo_type)
    if repo_type == "kernel":
        _record_publisher(repo_id.split("/", 1)[0], hub=hub, ledger=ledger)
    heads = sorted(set(refs.values()))
    heads += [hub.revision_sha(repo_id, rev, repo_type) for rev in extra_revisions]
    _record_histories(repo_id, heads, hub=hub, ledger=ledger, repo_type=repo_type)
    more = _unreached(repo_id, reach, hub=hub, ledger=ledger, repo_type=repo_type)
    _record_histories(repo_id, more, hub=hub, ledger=ledger, repo_type=repo_type)

    todo = ledger.unscanned_commits(repo_id)
    if heads_only:
        listed_heads = set(heads + more)
        todo = [sha for sha in todo if sha in listed_heads]
    if progress and todo:
        progress(f"{repo_id}: listing build/ of {len(todo)} commit(s)")
    with nullcontext(pool) if pool is not None else ThreadPoolExecutor(max_workers=max(1, jobs)) as threads:
        variants_found = _list_builds(repo_id, todo, hub=hub, ledger=ledger, pool=threads, repo_type=repo_type)
    hub.scanned.add(repo_id)
    return ScanReport(repo_id, len(refs), _commit_count(ledger, repo_id), len(todo), variants_found)


def _record_histories(repo_id: str, heads: list[str], *, hub: HubClient, ledger: Ledger, repo_type: str) -> None:
    for head in heads_without_history(ledger, repo_id, heads):
        ledger.record_history(repo_id, head, hub.history(repo_id, head, repo_type))


def _unreached(
    repo_id: str, revisions: tuple[str, ...], *, hub: HubClient, ledger: Ledger, repo_type: str
) -> list[str]:
    """The commits of `revisions` that the refs' histories do not reach, asked of the upstream."""
    out = []
    for rev in unknown_revisions(ledger, repo_id, revisions):
        try:
            out.append(hub.revision_sha(repo_id, rev, repo_type))
        except RevisionNotFound:
            pass  # the resolver refuses it with RevisionNotFound, recorded like any refusal
    return out


@retried
def unknown_revisions(ledger: Ledger, repo_id: str, revisions: tuple[str, ...]) -> list[str]:
    if not revisions:
        return []
    with ledger.view() as view:
        return [r for r in dict.fromkeys(revisions) if view.commit_for(repo_id, r) is None]


def _list_builds(
    repo_id: str, todo: list[str], *, hub: HubClient, ledger: Ledger, pool: Executor, repo_type: str
) -> int:
    """List build/ of each commit in `todo` (and read its metadata.json files), recording each listing as
    it arrives: a scan cut short (a quota's wait bound, a kill, an outage) keeps every listing it got, and
    lists only the rest when it runs again. The first failure stops what has not begun; it is raised once
    what is under way has landed and been recorded."""
    metadata = _Metadata(repo_id, hub=hub, ledger=ledger, repo_type=repo_type)

    with hub.pacer.work("api", "listings", len(todo)) as work:

        def one(sha: str) -> list[VariantInfo]:
            with work.item() as item:
                listing = hub.build_listing(repo_id, sha, repo_type, item=item)
            docs = metadata.of(listing, sha)
            return [_variant_info(name, files, docs) for name, files in sorted(listing.items())]

        pending = {pool.submit(one, sha): sha for sha in todo}
        failed: BaseException | None = None
        found = 0
        try:
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                builds = {}
                for fut in done:
                    sha = pending.pop(fut)
                    if fut.cancelled():
                        continue
                    if (e := fut.exception()) is not None:
                        if failed is None:
                            failed = e
                            for other in pending:
                                other.cancel()
                        continue
                    builds[sha] = fut.result()
                _record_builds(ledger, repo_id, builds)
                found += sum(len(v) for v in builds.values())
        except BaseException:
            for other in pending:
                other.cancel()
            raise
    if failed is not None:
        raise failed
    return found


def _record_builds(ledger: Ledger, repo_id: str, builds: dict[str, list[VariantInfo]]) -> None:
    """The listings, a few commits per write. A write holds the ledger's one write lock while it runs:
    a whole history in one transaction (or one hostile listing of 100k entries: ~40 s) held it past the
    busy timeout, and every other writer (another stager, serve's pull-through) failed with "locked by
    another process". Each commit is marked scanned in the write that records its rows. A single listing
    is bounded by FRT_MAX_LISTING_ENTRIES (wire.Limits)."""
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


class _Metadata:
    """metadata.json contents by git oid: from the ledger if seen before, else from upstream, each oid
    fetched once per scan whichever commits list it (and whichever threads ask at once)."""

    def __init__(self, repo_id: str, *, hub: HubClient, ledger: Ledger, repo_type: str):
        self.repo_id, self.hub, self.ledger, self.repo_type = repo_id, hub, ledger, repo_type
        self._once: Once[str, dict[str, Any] | None] = Once()

    def of(self, listing: dict[str, list[FileEntry]], sha: str) -> dict[str, dict[str, Any] | None]:
        """The contents of the metadata.json files of a commit's listing, by oid."""
        wanted = {m.git_oid: m for files in listing.values() if (m := _metadata_file(files)) is not None}
        out: dict[str, dict[str, Any] | None] = dict(self.ledger.known_metadata(set(wanted)))
        for oid, entry in wanted.items():
            if oid not in out:
                out[oid] = self._once.get(oid, functools.partial(self._fetch, entry, sha))
        return out

    def _fetch(self, entry: FileEntry, sha: str) -> dict[str, Any] | None:
        try:  # read to its listed size at most: more is not the file the listing names either
            raw = self.hub.fetch_small_file(self.repo_id, entry.path, sha, self.repo_type, size=entry.size)
        except TooLarge:
            return None
        if _git_blob_oid(raw) != entry.git_oid:  # not the file the listing names: never the publisher's word
            return None
        self.hub.small.remember(entry.git_oid, raw)  # as checked: a stage in this run stores it without a GET
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError):  # not JSON, or nested past what a parser should follow
            return None  # recorded as variant without metadata; resolve still sees the variant
        return doc if isinstance(doc, dict) else None


def _git_blob_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _variant_info(name: str, files: list[FileEntry], metadata: dict[str, dict[str, Any] | None]) -> VariantInfo:
    meta = _metadata_file(files)
    return VariantInfo(name, tuple(files), meta.git_oid if meta else None, metadata.get(meta.git_oid) if meta else None)
