"""Stage model repos: the files of a manifest's ``[models]`` entry, at its revision's commit, verified.

The data model, in the tables kernels already use (no new table, so no migration):

- the repo is a ``repos`` row with ``repo_type = "model"``; its refs and the commit's history are
  recorded as for a kernel (serve answers refs and /commits from them);
- the selection is one ``variants`` row named ``MODEL_SELECTION`` at that commit, with no metadata,
  holding exactly the matched files (paths from the repo root, git oid and LFS sha256 as listed);
  staging the same commit again with other patterns replaces it;
- the staged row has ``target = MODEL_TARGET``: a model has no targets, so it is staged once, for
  every target (export-cache writes it into every target's cache; env and matrix skip it);
- no view: a model is not loaded through LOCAL_KERNELS, so serve and export-cache read its blobs
  straight from the store, and verify checks that each selected file's blob is stored and sound.

The files are chosen by huggingface_hub's own ``filter_repo_objects``, the rule snapshot_download
applies to allow_patterns / ignore_patterns, so a manifest selects what a client would download.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

# From its own module: huggingface_hub.utils' lazy facade does not export it to mypy.
from huggingface_hub.utils._paths import filter_repo_objects

from frt.manifests import ModelSpec
from frt.resolver.errors import FrtError, LocalDiskError, UpstreamUnavailable
from frt.resolver.hub import HubClient
from frt.resolver.resolution import FileEntry, VariantInfo
from frt.resolver.resolve import make_request

from ..store.home import Home
from ..store.records import (
    MODEL_SELECTION,
    MODEL_TARGET,
    StagedRow,
    record_blobs,
    record_staged_rows,
    recorded_blobs,
    sha256_by_git_oid,
)
from .fetch import Fetched, IntegrityError, fetch_file, fetch_workers
from .kernels import StageReport, StageRow
from .space import check_space, missing_bytes
from .transport import Transport


def select_files(files: list[FileEntry], spec: ModelSpec) -> list[FileEntry]:
    """The files snapshot_download(allow_patterns=include, ignore_patterns=exclude) would fetch."""
    return list(
        filter_repo_objects(
            files,
            allow_patterns=list(spec.include) or None,
            ignore_patterns=list(spec.exclude) or None,
            key=lambda f: f.path,
        )
    )


def stage_models(
    specs: tuple[ModelSpec, ...], *, home: Home, hub: HubClient, jobs: int = 8, report: StageReport
) -> None:
    """Stage each model selection, one row each into `report`. An unreachable upstream is raised
    after what completed is recorded, as for kernels."""
    rows, dead = report.rows, None
    for spec in specs:
        try:
            rows.append(_stage_one(spec, home=home, hub=hub, jobs=jobs, report=report))
        except UpstreamUnavailable as e:
            dead = dead or e
            rows.append(_row(spec, None, [], "failed", str(e)))
        except IntegrityError as e:
            rows.append(_row(spec, e.commit, [], "refused", str(e)))
        except LocalDiskError:  # the disk, not this model: the stage stops, in one line (exit 4)
            raise
        except FrtError as e:  # RepoNotFound, RevisionNotFound, an unsafe listing
            rows.append(_row(spec, None, [], "refused", str(e)))
    if dead is not None:
        raise dead


def _row(spec: ModelSpec, commit: str | None, files: list[FileEntry], status: str, detail: str = "") -> StageRow:
    return StageRow(
        spec.repo,
        f"revision {spec.revision}",
        MODEL_TARGET,
        commit,
        MODEL_SELECTION if status == "staged" else None,
        len(files),
        sum(f.size for f in files),
        status,
        detail,
    )


def _stage_one(spec: ModelSpec, *, home: Home, hub: HubClient, jobs: int, report: StageReport) -> StageRow:
    ledger = home.ledger
    refs = hub.refs(spec.repo, repo_type="model")
    ledger.record_refs(spec.repo, refs, endpoint=hub.endpoint, repo_type="model")
    commit = refs.get(("branch", spec.revision)) or refs.get(("tag", spec.revision))
    if commit is None:
        commit = hub.revision_sha(spec.repo, spec.revision, repo_type="model")  # checked there
    ledger.record_history(spec.repo, commit, hub.history(spec.repo, commit, repo_type="model"))
    files = select_files(hub.repo_listing(spec.repo, commit, repo_type="model"), spec)
    if not files:
        return _row(
            spec,
            commit,
            [],
            "refused",
            f"{spec.source}: {spec.repo}@{commit[:12]}: no file matches "
            f"include {list(spec.include)} / exclude {list(spec.exclude)}",
        )
    fetched = _fetch(spec.repo, commit, files, home=home, hub=hub, jobs=jobs)
    record_blobs(ledger, (x.digest for x in fetched))
    report.needed_bytes += sum(f.size for f in files)
    report.downloaded_bytes += sum(x.downloaded for x in fetched)
    ledger.record_builds(spec.repo, {commit: [VariantInfo(MODEL_SELECTION, tuple(files))]})
    request = make_request(spec.repo, revision=spec.revision)
    record_staged_rows(
        ledger,
        [StagedRow(spec.repo, request.label, None, spec.revision, MODEL_TARGET, commit, MODEL_SELECTION)],
        store=home.store,
    )
    return _row(spec, commit, files, "staged")


def _fetch(repo: str, commit: str, files: list[FileEntry], *, home: Home, hub: HubClient, jobs: int) -> list[Fetched]:
    """Through the kernels' path (fetch_file): resumable, locked per blob, verified against the
    listing's LFS sha256 or git oid before the blob is stored."""
    ledger, transport = home.ledger, Transport(hub, bodies=max(1, jobs))
    known = sha256_by_git_oid(ledger, [f.git_oid for f in files if not f.sha256])
    # Each selection checked before its own first byte: a model's listing is read only after the kernels
    # are fetched, so what they took is already off the free space here.
    check_space(home.store, missing_bytes(home.store, files, known))
    recorded = recorded_blobs(ledger, [f.sha256 for f in files if f.sha256])

    def one(f: FileEntry) -> Fetched:
        return fetch_file(
            transport,
            home.store,
            repo,
            commit,
            f,
            known_sha256=known.get(f.git_oid),
            recorded=recorded,
            repo_type="model",
            stored_by_oid=lambda oid: sha256_by_git_oid(ledger, [oid]).get(oid),
            on_stored=lambda d: record_blobs(ledger, [d]),
        )

    with ThreadPoolExecutor(max_workers=fetch_workers(home.store, jobs)) as pool:
        return list(pool.map(one, files))
