"""Stage: resolve every kernel (and its kernel-depends) for every target, fetch exactly the
files of the chosen variants, verify them, and lay out the LOCAL_KERNELS view.

Idempotent: a rerun downloads nothing that is already verified in the store, and a
`.part` left by an interrupted run is resumed. Each refusal is recorded in the ledger.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any

from frt.resolver.errors import EXIT_BAD_INPUT, EXIT_OK, EXIT_REFUSED, FrtError, LocalDiskError, UpstreamUnavailable
from frt.resolver.hub import HubClient
from frt.resolver.kernel_metadata import ON_FILES, KernelMetadata, MetadataInvalid, dependency_request, listing_verdict
from frt.resolver.ledger import Ledger
from frt.resolver.python_depends import UnsupportedDependency
from frt.resolver.resolution import FileEntry, Refusal, Request, Resolution
from frt.resolver.resolve import refresh_and_decide
from frt.resolver.targets import Target

from ..events import record_event
from ..store.blobs import Digest
from ..store.home import Home
from ..store.protocol import BlobStore
from ..store.records import record_blobs, record_staged, record_wheels, recorded_blobs, sha256_by_git_oid
from ..store.view_trees import Views
from .fetch import Fetched, IntegrityError, PublisherDigestMismatch, expected_key, fetch_file, fetch_workers
from .progress import Progress
from .publisher import (
    digest_mismatch,
    metadata_refusal,
    publisher_expectations,
    variant_metadata,
    view_check,
)
from .space import check_space, missing_bytes
from .transport import Transport
from .wheels import NoWheel, WheelStager, default_index


@dataclass(frozen=True)
class StageRow:
    repo: str
    requested: str
    target: str
    commit: str | None
    variant: str | None
    files: int
    bytes: int
    status: str  # staged | refused | failed
    detail: str = ""
    publisher_digest: bool | None = None  # staged: whether metadata.json carried the publisher's digest
    wheels: tuple[str, ...] = ()  # staged: the wheels its python-depends need (frt.mirror.stage.wheels)
    bad_input: bool = False  # refused: the request named a repository that is not there (Refusal.bad_input)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__, wheels=list(self.wheels))


@dataclass
class StageReport:
    rows: list[StageRow] = field(default_factory=list)
    downloaded_bytes: int = 0
    needed_bytes: int = 0

    @property
    def ok(self) -> bool:
        return all(r.status == "staged" for r in self.rows)

    @property
    def exit_code(self) -> int:
        """0 when every row is staged; 2 where a row names a repository that is not there (the manifest's
        mistake, as scan and resolve say it); else 1 (refused or failed)."""
        if self.ok:
            return EXIT_OK
        return EXIT_BAD_INPUT if any(r.bad_input for r in self.rows) else EXIT_REFUSED


class Interrupted(FrtError):
    pass


def stage(
    requests: list[Request],
    targets: list[Target],
    *,
    home: Home,
    hub: HubClient,
    jobs: int = 8,
    publishers: tuple[str, ...] | None = None,
    progress: bool = True,
    wheel_index: str | None = None,
) -> StageReport:
    ledger, store = home.ledger, home.store
    views = home.views  # None on an object store: env --into writes a target's files
    if views is not None:
        views.sweep_tmp()
    outcomes = _resolve_closure(requests, targets, ledger=ledger, hub=hub, publishers=publishers, jobs=jobs)
    metas = {_key(o.resolution): o.metadata_parsed for o in outcomes if isinstance(o, _Checked)}
    resolutions = [o.resolution for o in outcomes if isinstance(o, _Checked)]
    report = StageReport()
    for o in outcomes:
        if isinstance(o, Refusal):
            report.rows.append(
                StageRow(
                    o.repo,
                    o.request.label,
                    str(o.target),
                    o.commit,
                    None,
                    0,
                    0,
                    "refused",
                    o.message,
                    bad_input=o.bad_input,
                )
            )

    # One download per distinct content, whichever repos, commits and targets share it.
    unique: dict[str, tuple[Resolution, FileEntry]] = {}
    for r in resolutions:
        for f in r.files:
            unique.setdefault(expected_key(f), (r, f))
    known = sha256_by_git_oid(ledger, [f.git_oid for _, f in unique.values() if not f.sha256])
    recorded = recorded_blobs(ledger, [f.sha256 for _, f in unique.values() if f.sha256])
    expect = publisher_expectations((r, metas[_key(r)]) for r in resolutions)
    report.needed_bytes = sum(f.size for _, f in unique.values())
    check_space(store, missing_bytes(store, (f for _, f in unique.values()), known))  # before the first byte
    fetched, failures = _fetch_all(
        unique,
        known,
        expect,
        recorded,
        ledger=ledger,
        transport=Transport(hub, bodies=max(1, jobs)),
        store=store,
        jobs=jobs,
        progress=progress,
    )
    report.downloaded_bytes = sum(x.downloaded for x in fetched.values())
    record_blobs(ledger, (x.digest for x in fetched.values()))

    good, wheels = [], _Wheels(home, hub, wheel_index)
    for r in resolutions:
        meta = metas[_key(r)]
        try:
            _link_checked(r, meta, fetched, failures, views)
            wheels.stage(r, meta.python_depends)
        except (IntegrityError, UpstreamUnavailable, NoWheel, UnsupportedDependency) as failed:
            status = "failed" if isinstance(failed, UpstreamUnavailable) else "refused"
            if status == "refused":
                error = failed.code if isinstance(failed, IntegrityError) else type(failed).__name__
                ledger.record_refusal(
                    Refusal(r.request, r.target, error, str(failed), detail=str(failed), commit=r.commit)
                )
            report.rows.append(
                StageRow(r.repo, r.request.label, str(r.target), r.commit, r.variant, 0, 0, status, str(failed))
            )
            continue
        good.append(r)
        report.rows.append(
            StageRow(
                r.repo,
                r.request.label,
                str(r.target),
                r.commit,
                r.variant,
                len(r.files),
                sum(f.size for f in r.files),
                "staged",
                publisher_digest=meta.has_digest,
                wheels=wheels.of.get((r.repo, r.commit, r.variant, str(r.target)), ()),
            )
        )
    report.downloaded_bytes += wheels.downloaded
    record_staged(ledger, good, wheels.of, store=store)
    if good:
        record_event(
            ledger,
            "stage",
            files=sum(len(r.files) for r in good),
            nbytes=report.downloaded_bytes,
            detail=f"{len(good)} staged, {len(report.rows) - len(good)} not",
        )
    report.rows.sort(key=lambda row: (row.repo, row.requested, row.target))
    dead = next((e for e in failures.values() if isinstance(e, UpstreamUnavailable)), None)
    if dead is not None:  # what completed is kept and recorded; the cause is one line, not a row per file
        raise dead
    return report


def _link_checked(
    r: Resolution,
    meta: KernelMetadata,
    fetched: dict[str, Fetched],
    failures: dict[str, Exception],
    views: Views | None,
) -> None:
    """Lay out a variant's view from its verified blobs, if its publisher's digest holds for them (on an
    object store, no view: the same check, on the hashes alone)."""
    failed = next((failures[expected_key(f)] for f in r.files if expected_key(f) in failures), None)
    if failed is not None:
        raise failed
    mismatch = digest_mismatch(r, meta, lambda f: fetched[expected_key(f)].digest.sha256)
    if mismatch:
        raise PublisherDigestMismatch(mismatch, repo=r.repo, path="", commit=r.commit)
    pairs = [(f, fetched[expected_key(f)].digest.sha256) for f in r.files]
    if views is not None:
        problems = views.link(r.repo, r.commit, r.variant, pairs, check=view_check(meta, pairs, r.variant))
    elif (verdict := listing_verdict(meta, pairs, r.variant)) is not None:
        problems = verdict
    else:
        problems = [ON_FILES.format(meta.digest_algorithm)]
    if problems:
        text = "; ".join(problems)
        raise PublisherDigestMismatch(
            f"{r.repo}@{r.commit[:12]} {r.variant}: the publisher's digest does not hold: {text}",
            repo=r.repo,
            path="",
            commit=r.commit,
        )


class _Wheels:
    """The wheels of each staged variant's python-depends (frt.mirror.stage.wheels): stored, recorded and linked
    into the home's find-links folder before the variant's row says it is staged."""

    def __init__(self, home: Home, hub: HubClient, index: str | None):
        self.home, self.hub, self.index = home, hub, index
        self.of: dict[tuple[str, str, str, str], tuple[str, ...]] = {}  # (repo, commit, variant, target)
        self._stager: WheelStager | None = None

    @property
    def downloaded(self) -> int:
        return self._stager.downloaded if self._stager else 0

    def stage(self, r: Resolution, python_depends: tuple[str, ...]) -> None:
        if not python_depends:
            return
        if self._stager is None:
            self._stager = WheelStager(self.home.store, self.hub, default_index(self.index))
        got = self._stager.for_variant(r, python_depends)
        record_blobs(self.home.ledger, (self._stager.digests[w.sha256] for w in got))
        record_wheels(self.home.ledger, got)
        if (views := self.home.views) is not None:  # else env --into writes them beside the variants
            views.link_wheels(got)
        self.of[(r.repo, r.commit, r.variant, str(r.target))] = tuple(w.filename for w in got)


@dataclass(frozen=True)
class _Checked:
    """A resolution whose metadata.json `kernels` can read (the mirror stages nothing it would not load)."""

    resolution: Resolution
    metadata_parsed: KernelMetadata


def _key(r: Resolution) -> tuple[str, str, str]:
    return (r.repo, r.commit, r.variant)


def _checked(outcome: Resolution | Refusal, ledger: Ledger) -> _Checked | Refusal:
    if isinstance(outcome, Refusal):
        return outcome
    try:
        return _Checked(outcome, variant_metadata(outcome))
    except MetadataInvalid as e:
        refusal = metadata_refusal(outcome, e)
        ledger.record_refusal(refusal)
        return refusal


def _resolve_closure(
    requests: list[Request],
    targets: list[Target],
    *,
    ledger: Ledger,
    hub: HubClient,
    publishers: tuple[str, ...] | None,
    jobs: int,
) -> list[_Checked | Refusal]:
    """Resolve requests for every target, then their kernel-depends (recursively) for the same target.
    With a trust policy, a kernel from another publisher is refused before upstream is asked about it."""

    def resolve_trusted(reqs: list[Request], tgts: list[Target]) -> list[_Checked | Refusal]:
        trusted = [r for r in reqs if publishers is None or r.repo.split("/", 1)[0] in publishers]
        # `or ()` only for the type: with publishers None every request is trusted, and none is refused here.
        out: list[Resolution | Refusal] = [
            _untrusted(r, t, publishers or (), ledger) for r in reqs if r not in trusted for t in tgts
        ]
        if trusted:
            out += refresh_and_decide(trusted, targets=tgts, ledger=ledger, hub=hub, jobs=jobs)
        return [_checked(o, ledger) for o in out]

    outcomes = resolve_trusted(requests, targets)
    seen = {(r.repo, r.label, str(t)) for r in requests for t in targets}
    frontier = [o for o in outcomes if isinstance(o, _Checked)]
    while frontier:
        by_target: dict[Target, list[Request]] = {}
        for res in frontier:
            for dep in res.metadata_parsed.depends:
                req = dependency_request(dep)
                target = res.resolution.target
                if (req.repo, req.label, str(target)) not in seen:
                    seen.add((req.repo, req.label, str(target)))
                    by_target.setdefault(target, []).append(req)
        frontier = []
        for target, reqs in by_target.items():
            more = resolve_trusted(reqs, [target])
            outcomes += more
            frontier += [o for o in more if isinstance(o, _Checked)]
    return outcomes


def _untrusted(request: Request, target: Target, publishers: tuple[str, ...], ledger: Ledger) -> Refusal:
    org = request.repo.split("/", 1)[0]
    text = f"{request.repo}: publisher {org!r} is not in the manifest's trusted publishers ({', '.join(publishers)})"
    refusal = Refusal(request, target, "UntrustedPublisher", text, detail=text)
    ledger.record_refusal(refusal)
    return refusal


def _fetch_all(
    unique: dict[str, tuple[Resolution, FileEntry]],
    known: dict[str, str],
    expect: dict[str, set[str]],
    recorded: dict[str, Digest],
    *,
    ledger: Ledger,
    transport: Transport,
    store: BlobStore,
    jobs: int,
    progress: bool,
) -> tuple[dict[str, Fetched], dict[str, Exception]]:
    meter = Progress(sum(f.size for _, f in unique.values()), len(unique)) if progress else None
    stopped: list[BaseException] = []  # what ended the stage, seen by the downloads still in flight

    def one(key: str) -> Fetched:
        r, f = unique[key]
        add, done = meter.file(f.path.rsplit("/", 1)[-1], f.size) if meter else (None, None)

        def on_bytes(n: int) -> None:
            if stopped:  # a disk error's kind when the disk ended it: that part is removed too (fetch.py)
                full = isinstance(stopped[0], LocalDiskError)
                raise LocalDiskError(f"stopped: {stopped[0]}") if full else Interrupted("interrupted")
            if add:
                add(n)

        ok = False
        try:
            out = fetch_file(
                transport,
                store,
                r.repo,
                r.commit,
                f,
                known_sha256=known.get(f.git_oid),
                publisher=expect.get(key),
                recorded=recorded,
                on_bytes=on_bytes,
                stored_by_oid=lambda oid: sha256_by_git_oid(ledger, [oid]).get(oid),
                on_stored=lambda d: record_blobs(ledger, [d]),
            )
            ok = True
        finally:
            if done:
                done(ok)
        return out

    fetched: dict[str, Fetched] = {}
    failures: dict[str, Exception] = {}
    pool = ThreadPoolExecutor(max_workers=fetch_workers(store, jobs))
    try:
        # Largest first: a big file started last would run on alone after the others are done.
        futures = {pool.submit(one, key): key for key in sorted(unique, key=lambda k: -unique[k][1].size)}
        for fut in as_completed(futures):
            key = futures[fut]
            try:
                fetched[key] = fut.result()
            except (IntegrityError, UpstreamUnavailable) as e:
                failures[key] = e
    except BaseException as e:
        # Downloads in flight stop at their next chunk. Their .part files stay for a rerun, unless the
        # disk is what failed: then every part goes (fetch.py), so that the disk is not left full.
        stopped.append(e)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        if meter:
            meter.close()
    return fetched, failures
