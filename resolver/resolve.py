"""Resolve a kernel for a target: pins applied, upstream refreshed unless offline, refusals recorded."""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

from .core import resolve_request
from .errors import BadInput
from .gate import check_ref, check_repo_id
from .hub import HubClient, RepoNotFound
from .ledger import Ledger
from .ledger.retry import retried
from .repo_ids import did_you_mean, pin_variable, pinned_revision
from .resolution import KernelUnavailable, Refusal, Request, Resolution
from .scan import scan, unknown_revisions
from .targets import Target


def make_request(
    repo_id: str, *, version: int | None = None, revision: str | None = None, environ: Mapping[str, str] | None = None
) -> Request:
    """The request a user means: FRT_KERNEL_REV_<ID> overrides version and revision."""
    check_repo_id(repo_id)
    pin = pinned_revision(repo_id, environ)
    if pin is not None:  # a revision becomes refs/<name> in an exported cache: through the gate
        check_ref(pin, where=pin_variable(repo_id), what="revision")
        return Request(repo_id, revision=pin, pinned=True)
    if (version is None) == (revision is None):
        raise BadInput(f"{repo_id}: give exactly one of a version or a revision")
    if version is not None and (not isinstance(version, int) or version < 0):
        raise BadInput(f"{repo_id}: version must be a non-negative integer, got {version!r}")
    if revision is not None:
        check_ref(revision, where=repo_id, what="revision")
    return Request(repo_id, version=version, revision=revision)


def resolve(
    repo_id: str,
    *,
    target: Target,
    ledger: Ledger,
    version: int | None = None,
    revision: str | None = None,
    hub: HubClient | None = None,
    offline: bool = False,
    environ: Mapping[str, str] | None = None,
) -> Resolution:
    """Resolve `repo_id` for `target`, or raise `KernelUnavailable` (after recording it)."""
    request = make_request(repo_id, version=version, revision=revision, environ=environ)
    return resolve_requests([request], target=target, ledger=ledger, hub=hub, offline=offline)[0]


def resolve_requests(
    requests: list[Request], *, target: Target, ledger: Ledger, hub: HubClient | None = None, offline: bool = False
) -> list[Resolution]:
    outcomes = refresh_and_decide(requests, targets=[target], ledger=ledger, hub=hub, offline=offline)
    for outcome in outcomes:
        if isinstance(outcome, Refusal):
            raise KernelUnavailable.of(outcome)
    return outcomes  # type: ignore[return-value]


def refresh_and_decide(
    requests: list[Request],
    *,
    targets: list[Target],
    ledger: Ledger,
    hub: HubClient | None = None,
    offline: bool = False,
    jobs: int = 8,
) -> list[Resolution | Refusal]:
    """Every request × target, as outcomes; every refusal is recorded in the ledger.

    A repo is scanned once per run (the run's Hub client says which it scanned: a stage resolving
    kernel-depends per target, a bisect resolving and staging each probe), unless a request names a
    revision the ledger cannot place. `jobs`: the listings in flight at once, all repos together.
    """
    upstream_refusals: dict[str, str] = {}  # repo -> the upstream's "repository not found"
    if not offline:
        hub = hub or HubClient()

        def refresh(repo: str) -> None:
            reach = tuple(r.revision for r in requests if r.repo == repo and r.revision)
            try:
                scan(repo, hub=hub, ledger=ledger, reach=reach, pool=listings)
            except RepoNotFound as e:
                upstream_refusals[repo] = f"{e}{did_you_mean(repo, ledger.repos())}"

        # Repos are independent: their scans overlap their round-trips (the ledger serializes writes), and
        # share one pool of listing threads, so `jobs` bounds the listings of the whole run.
        repos = [r for r in dict.fromkeys(r.repo for r in requests) if _to_scan(r, requests, hub, ledger)]
        with (
            ThreadPoolExecutor(max_workers=max(1, jobs)) as listings,
            ThreadPoolExecutor(max_workers=max(1, min(jobs, 8, len(repos)))) as pool,
        ):
            list(pool.map(refresh, repos))
    outcomes = _decide(ledger, requests, targets, upstream_refusals)
    for outcome in outcomes:
        if isinstance(outcome, Refusal):
            ledger.record_refusal(outcome)
    return outcomes


def _to_scan(repo: str, requests: list[Request], hub: HubClient, ledger: Ledger) -> bool:
    if repo not in hub.scanned:
        return True
    return bool(unknown_revisions(ledger, repo, tuple(r.revision for r in requests if r.repo == repo and r.revision)))


@retried
def _decide(
    ledger: Ledger, requests: list[Request], targets: list[Target], upstream_refusals: dict[str, str]
) -> list[Resolution | Refusal]:
    outcomes: list[Resolution | Refusal] = []
    with ledger.view() as view:
        for request in requests:
            for target in targets:
                if request.repo in upstream_refusals:
                    text = upstream_refusals[request.repo]
                    outcomes.append(Refusal(request, target, "RepoNotFound", text, detail=text, bad_input=True))
                else:
                    outcomes.append(resolve_request(view, request, target))
    return outcomes
