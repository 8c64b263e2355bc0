"""verify: re-hash every blob in the store, check that every staged view links to the right one, and
that every staged model file (models have no view) has its blob recorded and stored.

What it reads of the ledger it reads first, in one go (verify_reads.py): with sqlite3 alone where the
ledger is the home's SQLite file at exactly this code's schema, else through the ledger's own path. The
ledger is opened then, or only to adopt blobs the store holds unrecorded (its one write).

On a full disk (the home's, Home.reads_when_full) the ledger is read as on a read-only home and nothing is
adopted: adopting needs room for the ledger's index and log, and verify is what an operator runs to learn
what the disk holds. A recorded blob the store lacks is a problem only where something references it: gc
removes an unreferenced blob's file before its record (so that it frees space before it writes), and one
cut short between the two leaves such records, which the next gc drops."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from frt.resolver.kernel_metadata import ON_FILES, MetadataInvalid, listing_verdict, parse_metadata, validate_variant

from ..event_rows import EventRow
from .blobs import Digest, listed_blobs
from .home import Home
from .protocol import BlobStore
from .verify_reads import VerifyRecords, ledger_records, read_records, variant_keys
from .view_trees import Views, wheels_dir


@dataclass
class VerifyReport:
    blobs: int = 0
    bytes: int = 0
    view_files: int = 0
    problems: list[str] = field(default_factory=list)
    adopted: int = 0  # verified blobs an interrupted stage stored but did not record
    readonly: bool = False  # a read-only home: reported, never adopted (adopting is a ledger write)
    disk_full: bool = False  # read-only because the home's disk is full (Home.reads_when_full)
    stale_records: int = 0  # records of unreferenced blobs the store no longer holds (gc drops them)
    unadopted: int = 0  # such blobs left unrecorded because the home is read-only
    no_digest: int = 0  # staged variants whose metadata.json carries no publisher digest
    model_files: int = 0  # staged model files checked against the store
    wheels: int = 0  # wheels of python-depends checked: recorded, stored, linked in views/wheels

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__, ok=self.ok)


def verify(home: Home) -> VerifyReport:
    """On an object store (--store s3://…) every object is streamed and re-hashed the same way; it has no
    views to check, and each staged variant's publisher's digest is checked on the re-hashed blobs."""
    records = home.quick(read_records) if home.store_url is None else None
    if records is None:
        records = ledger_records(home.ledger)
    store = home.store
    report = VerifyReport()
    recorded = {d.sha256: d for d in records.blobs}
    stored = set(store.blob_shas())
    referenced = _referenced(records)
    for sha, d in recorded.items():
        said = _quarantined(records.quarantined.get(sha))
        if sha not in stored and sha not in referenced:
            report.stale_records += 1
            continue
        if sha not in stored:
            report.problems.append(f"missing blob {sha} ({d.size} bytes){said}")
            continue
        got = store.digest(sha)
        report.blobs += 1
        report.bytes += got.size
        if got.sha256 != sha or got.size != d.size:
            report.problems.append(f"corrupt blob {sha}: content hashes to {got.sha256}, {got.size} bytes{said}")
    adopt = []
    for sha in sorted(stored):
        if sha in recorded:
            continue
        got = store.digest(sha)
        report.blobs += 1
        report.bytes += got.size
        if got.sha256 == sha:
            adopt.append(got)
        else:
            report.problems.append(f"corrupt blob {sha} (unrecorded): content hashes to {got.sha256}")
    report.readonly, report.disk_full = home.readonly, home.full
    if report.readonly:
        report.unadopted = len(adopt)
    else:
        _adopt(home, adopt)
        report.adopted = len(adopt)
    # A listed file's blob, as records.blob_for would find it now: the adopted are recorded.
    by_git_oid = {d.git_oid: d.sha256 for d in (*records.blobs, *([] if report.readonly else adopt))}
    views = home.views
    if views is not None:
        _check_views(records, by_git_oid, views, report)
    _check_models(records, by_git_oid, store, report)
    _check_wheels(home, records, report, views)
    if not any("view " in p for p in report.problems):
        _check_publisher_digests(records, by_git_oid, views, report)
    return report


def _referenced(records: VerifyRecords) -> set[str]:
    """The sha256 of every blob a staged row's files or wheels name (as gc counts references)."""
    by_git_oid = {d.git_oid: d.sha256 for d in records.blobs}
    files = [f for key in variant_keys(records.staged) for f in records.variants[key][0]]
    listed = listed_blobs(files, by_git_oid)
    return {sha for sha in listed.values() if sha} | {w[2] for w in records.wheels.values()}


def _adopt(home: Home, digests: list[Digest]) -> None:
    if digests:  # the ledger is opened (and SQLAlchemy imported) only where there is something to record
        from .records import record_blobs

        record_blobs(home.ledger, digests)


def _quarantined(e: EventRow | None) -> str:
    """A blob's problem line's end, when serve found it bad on read (serve/integrity.py) and said so."""
    if e is None:
        return ""
    return f": serve quarantined it at {e.at:%Y-%m-%d %H:%M:%S} UTC ({e.detail}); 'frt-mirror stage' fetches it again"


def _check_publisher_digests(
    records: VerifyRecords, by_git_oid: dict[str, str], views: Views | None, report: VerifyReport
) -> None:
    """Each staged variant against its publisher's digest, by kernels' rule: needs no network, so it
    holds on the cluster too, whatever mirrors the bytes passed through. Without views (an object store),
    on the blobs' sha256s as recorded: every stored one was re-hashed against its name above."""
    keys = variant_keys(r for r in records.staged if not r.is_model)
    blobs = listed_blobs((f for key in keys for f in records.variants[key][0]), by_git_oid)
    for repo, commit, variant in keys:
        files, doc = records.variants[(repo, commit, variant)]
        try:
            meta = parse_metadata(doc or None)
        except MetadataInvalid as e:
            report.problems.append(f"{repo}@{commit[:12]} {variant}: {e}")
            continue
        report.no_digest += not meta.has_digest
        if views is not None:
            problems = validate_variant(meta, views.variant_dir(repo, commit, variant))
        else:
            pairs = [(f, sha) for f in files if (sha := blobs[f])]
            verdict = listing_verdict(meta, pairs, variant)
            problems = [ON_FILES.format(meta.digest_algorithm)] if verdict is None else verdict
        for problem in problems:
            report.problems.append(f"{repo}@{commit[:12]} {variant}: publisher's digest: {problem}")


def _check_models(records: VerifyRecords, by_git_oid: dict[str, str], store: BlobStore, report: VerifyReport) -> None:
    """A model file is sound when its listed hash names a recorded blob that is in the store: the
    blob itself was re-hashed above."""
    entries = [
        (r.repo, r.commit, f)
        for r in records.staged
        if r.is_model
        for f in records.variants[(r.repo, r.commit, r.variant)][0]
    ]
    blobs = listed_blobs((f for _, _, f in entries), by_git_oid)
    for repo, commit, f in entries:
        report.model_files += 1
        if (sha := blobs[f]) is None or not store.has(sha):
            report.problems.append(f"model {repo}@{commit[:12]} {f.path}: no verified blob is stored for it")


def _check_wheels(home: Home, records: VerifyRecords, report: VerifyReport, views: Views | None) -> None:
    """Each wheel a staged row needs: recorded, its blob stored (re-hashed above, so its sha256 is the
    one its index vouched for) and linked under its name in the find-links folder pip is pointed at
    (where the home has views: an object store's wheels are written out by env --into)."""
    needed = sorted({w for r in records.staged for w in r.wheels})
    folder = wheels_dir(home.root)
    for name in needed:
        report.wheels += 1
        if name not in records.wheels:
            report.problems.append(f"wheel {name}: a staged row needs it and the ledger has no record of it")
            continue
        sha = records.wheels[name][2]
        link = folder / name
        if not home.store.has(sha):
            report.problems.append(f"wheel {name}: its blob {sha} is not in the store")
        elif views is not None and not views.is_link_to(link, sha):
            report.problems.append(f"wheel {link}: missing or not a link to blob {sha}")


def _check_views(records: VerifyRecords, by_git_oid: dict[str, str], views: Views, report: VerifyReport) -> None:
    entries = [
        (repo, commit, f)
        for repo, commit, variant in variant_keys(r for r in records.staged if not r.is_model)
        for f in records.variants[(repo, commit, variant)][0]
    ]
    blobs = listed_blobs((f for _, _, f in entries), by_git_oid)
    for repo, commit, f in entries:
        path = views.root / views.repo_folder(repo) / commit / f.path
        sha = blobs[f]
        report.view_files += 1
        if sha is None:
            report.problems.append(f"view {path}: no verified blob is recorded for it")
        elif not path.is_file():
            report.problems.append(f"view {path}: missing")
        elif not views.is_link_to(path, sha):
            report.problems.append(f"view {path}: not a link to blob {sha}")
