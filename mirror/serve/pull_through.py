"""Pull-through: what a fenced site's mirror does on a miss (`serve --upstream URL --allow ORG`).

A request for an allowed repo that the mirror cannot answer from what it has is resolved against the
upstream, recorded in the ledger, and answered; a file is fetched, exactly the one asked for, through
stage's own path (fetch_file: one writer per blob, verified against the upstream's LFS sha256 or git
oid and the publisher's digest before it is stored). What was pulled is an ordinary staged set:

- a kernel's refs, each head's history and its build/ listing (all variants, with metadata.json) go into
  the resolver's tables, as `scan` writes them, but only for the heads (scan(heads_only=True));
- once every file of a variant is stored, its view is laid out (the publisher's digest checked, as
  stage does) and a staged row is recorded with target PULLED + variant: a target's staged set takes it
  where that target accepts the variant (records.staged_for), so env, export-cache and bundle see it;
- a model's refs and history go to the ledger; its listing stays in memory (a model commit has no
  variants to record it under), and the files pulled so far are its MODEL_SELECTION, as if staged with
  exactly those paths. After a restart with the upstream down, a model serves what was pulled.

This module is synchronous and does one thing per call; the serve app (frt.mirror.serve.pull) adds
the single flight, the refs TTL and the outage policy on top.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from contextlib import nullcontext
from typing import TYPE_CHECKING

from frt.resolver.errors import DISK_FULL_ERRNOS, BadInput, LedgerUnavailable, LocalDiskError
from frt.resolver.gate import check_repo_id
from frt.resolver.hub import HubClient
from frt.resolver.resolution import FileEntry, Resolution, VariantInfo
from frt.resolver.resolve import make_request
from frt.resolver.scan import heads_without_history, scan
from frt.resolver.targets import parse_target

from ..events import events_with_ref, record_event
from ..stage.fetch import PublisherDigestMismatch, expected_key, fetch_file
from ..stage.publisher import digest_mismatch, publisher_expectations, variant_metadata, view_check
from ..stage.transport import Transport
from ..store.home import Home
from ..store.lock import store_writer
from ..store.records import (
    MODEL_SELECTION,
    MODEL_TARGET,
    PULLED,
    StagedRow,
    blob_for,
    record_blobs,
    record_staged_rows,
    recorded_blobs,
    sha256_by_git_oid,
    staged_rows,
)
from .cache_cap import CacheKeeper, NoRoom
from .catalog import ServedCommit, ServedFile, ServedRepo, add_refs
from .pin import Pin
from .pull_withdrawn import withdraw_pulled, withdrawn_commits

if TYPE_CHECKING:
    from ..store.blobs import Digest
    from ..store.protocol import BlobStore

SHA = re.compile(r"[0-9a-f]{40}")
VERSION = re.compile(r"v(\d+)")
UNVOUCHED = "pull-unvouched"  # the events kind: see note_unvouched
# A pulled variant was chosen by its client for a target the mirror never learns; a Resolution needs one,
# and nothing that reads a pulled Resolution (publisher checks, views, the staged row) looks at it.
NO_TARGET = parse_target("torch0.0-cpu-x86_64-linux")


class NotAllowed(BadInput):
    """A repo outside the allow-list: answered as the Hub answers a repo that does not exist."""


class PullThrough:
    def __init__(self, home: Home, hub: HubClient, allow: frozenset[str]):
        self.home, self.hub, self.allow = home, hub, allow
        self.transport = Transport(hub)
        self._listings: dict[tuple[str, str], tuple[FileEntry, ...]] = {}  # a model commit's files
        self._selection = threading.Lock()  # a model's selection is read, extended and written back
        self.cache: CacheKeeper | None = None  # serve --cache-max / --min-free: room made first (cache_cap.py)

    def allowed(self, repo_id: str) -> bool:
        return "*" in self.allow or repo_id.split("/", 1)[0] in self.allow

    def named(self, org: str) -> bool:
        """Is the org named in the allow-list, not only let in by '*'? Under '*' any string a client
        sends is an org: nothing is recorded of one before the upstream has answered for a repo of it."""
        return org in self.allow

    # -- upstream -> ledger ----------------------------------------------------------------------

    def refresh(self, repo_type: str, repo_id: str, revision: str | None = None) -> None:
        """Record the upstream's refs, and each new head's history and listing (also `revision`'s, when
        it is a commit sha no ref points at). RepoNotFound / RevisionNotFound / UpstreamUnavailable
        are the upstream's answer, raised."""
        check_repo_id(repo_id)
        if not self.allowed(repo_id):
            raise NotAllowed(f"{repo_id} is not in this mirror's allow-list")
        extra = (revision,) if revision and SHA.fullmatch(revision) else ()
        if repo_type == "kernel":
            scan(
                repo_id,
                hub=self.hub,
                ledger=self.home.ledger,
                repo_type=repo_type,
                extra_revisions=extra,
                heads_only=True,
            )
            withdraw_pulled(self.home, repo_id)  # what the upstream dropped goes here too
            return
        ledger, hub = self.home.ledger, self.hub
        refs = hub.refs(repo_id, repo_type)
        ledger.record_refs(repo_id, refs, endpoint=hub.endpoint, repo_type=repo_type)
        heads = sorted(set(refs.values())) + [hub.revision_sha(repo_id, r, repo_type) for r in extra]
        for head in heads_without_history(ledger, repo_id, heads):
            ledger.record_history(repo_id, head, hub.history(repo_id, head, repo_type))
        for head in heads:
            if (repo_id, head) not in self._listings:
                self._listings[(repo_id, head)] = tuple(hub.repo_listing(repo_id, head, repo_type))

    # -- ledger -> what serve answers ------------------------------------------------------------

    def served_repo(self, repo_type: str, repo_id: str) -> ServedRepo | None:
        """Every recorded commit with its listed files; a file not stored yet has `blob` None."""
        ledger, store = self.home.ledger, self.home.store
        with ledger.view() as v:
            if not v.known(repo_id):
                return None
            served = ServedRepo(repo_id, repo_type)
            commits = v.commits(repo_id)
            rows = [r for r in staged_rows(ledger) if r.repo == repo_id]
            gone = withdrawn_commits(ledger, repo_id, rows, view=v)  # only the upstream's dropped refs reached them
            commits = [c for c in commits if c.sha not in gone]
            served.meta = {c.sha: (c.date, c.title) for c in commits}
            listed: dict[str, list[FileEntry]] = {}
            for c in commits:
                for name in v.variant_names(repo_id, c.sha) or ():
                    listed.setdefault(c.sha, []).extend(v.variant(repo_id, c.sha, name)[0])
            for (rid, sha), files in self._listings.items():
                if rid == repo_id:
                    listed.setdefault(sha, []).extend(files)
            blobs = blob_for(ledger, (f for fs in listed.values() for f in fs))
            stored = store.stored_of({sha for sha in blobs.values() if sha})  # an object store: one listing
            for c in commits:
                if c.sha in listed:
                    commit = served.commits[c.sha] = ServedCommit(c.sha, c.date, c.title)
                    for f in listed[c.sha]:
                        commit.files[f.path] = served_file(f, blobs.get(f), store, stored)
            add_refs(v, served, rows, upstream=True)
        return served if served.commits else None

    def publisher_trusted(self, org: str, ask: bool = False) -> bool | None:
        """What the upstream said of the org's trust, as recorded; `ask`: ask it first (and record it,
        for an org the allow-list names: under '*' scan records it once a repo of the org is pulled, so a
        scanner that names orgs by the thousand, each of which an upstream may vouch for, adds no row)."""
        if ask and (trusted := self.hub.publisher_trusted(org)) is not None:
            try:
                if self.named(org):
                    self.home.ledger.record_publisher(org, trusted, endpoint=self.hub.endpoint)
            except (LedgerUnavailable, LocalDiskError):  # the upstream's word answers now; recorded on a later ask
                pass
            return trusted
        info = self.home.ledger.publishers({org}).get(org)
        return info.trusted if info else None

    # -- one file --------------------------------------------------------------------------------

    def note_unvouched(self, key: str, path: str) -> None:
        """Bytes of blob `key` reached a client before they were verified, and then were not: a client
        may hold them as the start of its `.incomplete` file (serve/stream.py)."""
        record_event(self.home.ledger, UNVOUCHED, ref=key, detail=path)

    def unvouched(self, key: str) -> bool:
        """Was `key` ever streamed unverified from a fetch that then failed? Then no client's resume of
        it is answered with a tail (serve answers the whole file)."""
        return bool(events_with_ref(self.home.ledger, UNVOUCHED, key))

    def fetch(
        self, repo_type: str, repo_id: str, commit: str, path: str, on_bytes: Callable[[int], None] = lambda n: None
    ) -> tuple[ServedFile, int, Pin | None]:
        """Fetch `path` at `commit` into the store (verified), record it, and when that completes a
        kernel variant, stage the variant. The file as served from now on, the bytes downloaded, and
        under a cache cap its pin (pin.py: no eviction takes it before its answers open it; NoRoom where
        it was evicted before it could be pinned). `on_bytes` is told each write to the `.part` file (a
        negative count: it restarted from byte 0)."""
        with store_writer(self.home):  # a gc waits: the blob is referenced (staged) only at the end
            entry, variant = self._entry(repo_type, repo_id, commit, path)
            ledger, store = self.home.ledger, self.home.store
            publisher = None
            if variant is not None:
                publisher = publisher_expectations([(variant, variant_metadata(variant))]).get(expected_key(entry))
            known = sha256_by_git_oid(ledger, [entry.git_oid]) if not entry.sha256 else {}
            cache, pins = self.cache, list[Pin | None]()
            with cache.room(expected_key(entry), entry.size) if cache else nullcontext():
                got = fetch_file(
                    self.transport,
                    store,
                    repo_id,
                    commit,
                    entry,
                    known_sha256=known.get(entry.git_oid),
                    publisher=publisher,
                    recorded=recorded_blobs(ledger, [entry.sha256] if entry.sha256 else []),
                    repo_type=repo_type,
                    stored_by_oid=lambda oid: sha256_by_git_oid(ledger, [oid]).get(oid),
                    on_stored=lambda d: pins.append(self._stored(d)),
                    on_bytes=on_bytes,
                )
            if cache is not None and not any(pins):  # found stored (another worker's): pinned now, if still there
                with cache.shared():
                    pins = [cache.pin(got.digest.sha256)]
                if pins[0] is None:
                    raise NoRoom("evicted as soon as it was found stored")
            try:
                if got.downloaded:
                    record_event(ledger, "pull", ref=f"{repo_id}@{commit}", files=1, nbytes=got.downloaded, detail=path)
                if variant is not None:
                    with cache.shared() if cache else nullcontext():  # no eviction while its view is linked
                        self._stage_if_complete(variant)
                else:
                    self._extend_selection(repo_id, commit, entry)
            except OSError as e:  # a view's link on a full disk: the disk's error, as the ledger's is
                if e.errno not in DISK_FULL_ERRNOS:
                    raise
                raise LocalDiskError.writing(f"the view of {repo_id}@{commit[:12]}", e) from None
        return served_file(entry, got.digest.sha256, store), got.downloaded, next(iter(pins), None)

    def _stored(self, d: Digest) -> Pin | None:
        record_blobs(self.home.ledger, [d])
        if self.cache is not None:  # pinned, then evictable, unless a stage references it
            return self.cache.stored(d.sha256)
        return None

    def _entry(self, repo_type: str, repo_id: str, commit: str, path: str) -> tuple[FileEntry, Resolution | None]:
        if repo_type != "kernel":
            files = self._listings.get((repo_id, commit), ())
            entry = next((f for f in files if f.path == path), None)
            if entry is None:
                raise BadInput(f"{path} is not listed at {repo_id}@{commit[:12]}")
            return entry, None
        name = path.split("/")[1] if path.startswith("build/") and path.count("/") >= 2 else None
        with self.home.ledger.view() as v:
            files, meta = v.variant(repo_id, commit, name) if name else ((), {})
            versions = [
                int(m.group(1))
                for kind, ref, sha in v.refs(repo_id)
                if kind == "branch" and sha == commit and (m := VERSION.fullmatch(ref))
            ]
        entry = next((f for f in files if f.path == path), None)
        if entry is None:
            raise BadInput(f"{path} is not listed at {repo_id}@{commit[:12]}")
        request = make_request(repo_id, version=max(versions)) if versions else make_request(repo_id, revision=commit)
        assert name is not None  # its file was listed: a build/<variant>/ path
        return entry, Resolution(request, NO_TARGET, commit, name, tuple(files), meta or {})

    def _stage_if_complete(self, r: Resolution) -> None:
        """All of the variant's files stored: lay out its view (the publisher's digest checked, as stage
        does) and record it staged. A digest that does not hold is recorded as stage records it."""
        ledger, store = self.home.ledger, self.home.store
        blobs = blob_for(ledger, r.files)
        if not all((sha := blobs.get(f)) and store.has(sha) for f in r.files):
            return
        meta = variant_metadata(r)
        problem = digest_mismatch(r, meta, lambda f: blobs[f])
        if problem is None and (views := self.home.views) is not None:  # an object store's home has none
            pairs = [(f, sha) for f in r.files if (sha := blobs[f])]  # every one of them (checked above)
            problems = views.link(r.repo, r.commit, r.variant, pairs, check=view_check(meta, pairs, r.variant))
            problem = "; ".join(problems) or None
        if problem is not None:
            raise PublisherDigestMismatch(problem, repo=r.repo, path="", commit=r.commit)
        req = r.request
        record_staged_rows(
            ledger,
            [StagedRow(r.repo, req.label, req.version, req.revision, PULLED + r.variant, r.commit, r.variant)],
            store=store,
        )

    def _extend_selection(self, repo_id: str, commit: str, entry: FileEntry) -> None:
        """A model's selection is what was pulled of it: one more file, recorded as stage_models would."""
        ledger = self.home.ledger
        with self._selection, ledger.named_lock(f"pull {repo_id}@{commit}"):
            with ledger.view() as v:
                have = (
                    v.variant(repo_id, commit, MODEL_SELECTION)[0]
                    if MODEL_SELECTION in (v.variant_names(repo_id, commit) or ())
                    else ()
                )
            if entry in have:
                return
            files = tuple(sorted({*have, entry}, key=lambda f: f.path))
            ledger.record_builds(repo_id, {commit: [VariantInfo(MODEL_SELECTION, files)]})
            request = make_request(repo_id, revision=commit)
            record_staged_rows(
                ledger,
                [StagedRow(repo_id, request.label, None, commit, MODEL_TARGET, commit, MODEL_SELECTION)],
                store=self.home.store,
            )


def served_file(f: FileEntry, content: str | None, store: BlobStore, stored: set[str] | None = None) -> ServedFile:
    """A listed file as serve answers it; `blob` None until its verified bytes are stored (`stored`: the
    blobs known to be, else the store is asked)."""
    # bool(content) rules out None, which mypy does not narrow through bool()
    held = bool(content) and (content in stored if stored is not None else store.has(content))  # type: ignore[arg-type]
    return ServedFile(
        f.path,
        f.size,
        f.git_oid,
        content or f.sha256 or "",
        f.sha256 is not None,
        store.locator(content) if held and content else None,
    )
