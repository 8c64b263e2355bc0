"""bundle / import: carry a staged set across an air gap in one self-describing tar.

The archive holds `frt-bundle.json` first (the ledger rows that describe the set, and the list
of blobs, and the upstream's trustedKernelPublisher per org), then `blobs/<sha256>` for every blob a selected staged row needs. Import trusts
nothing in it: every member is streamed into tmp/ and hashed, and only when all of them match
the manifest does anything enter the store, the ledger or the views. The bundle is not signed:
this catches damage and tampering with the blobs, not a forged manifest.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import tarfile
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from importlib.metadata import version as dist_version
from pathlib import Path

from frt.resolver import FileEntry, Request, parse_target
from frt.resolver.errors import BadInput, VerificationFailed
from frt.resolver.gate import (
    check_commit,
    check_git_oid,
    check_org,
    check_path,
    check_ref,
    check_repo_id,
    check_sha256,
    check_variant,
)
from frt.resolver.ledger import PublisherInfo
from frt.resolver.ledger_io import merge_repo_record, repo_record
from frt.resolver.migrations import utcnow
from frt.resolver.resolution import VariantInfo, parent_chain

from frt.atomic import fsync_dir

from .home import Home
from .records import MODEL_SELECTION, PULLED, StagedRow, all_blobs, blob_for, record_blobs, record_staged_rows, staged_rows
from .render import human_bytes, table
from .store import CHUNK, BlobStore, Digest

FORMAT = 2  # 2: each head's history as the upstream listed it, not parent links
READS = (1, 2)
MANIFEST = "frt-bundle.json"
MAX_MANIFEST = 256 << 20  # read into memory: refuse a hostile giant before reading it
_BLOB = re.compile(r"blobs/([0-9a-f]{64})")
_REGULAR = (tarfile.REGTYPE, tarfile.AREGTYPE)  # never links, devices or dirs


class BundleRejected(VerificationFailed):
    """A bundle that cannot be written or trusted; on import, nothing of it was kept (exit 1)."""


@dataclass
class BundleReport:
    path: Path
    blobs: int
    bytes: int
    staged: list[StagedRow]
    new_blobs: int | None = None  # import only: blobs this home did not have
    new_rows: int | None = None  # import only: staged rows added or changed

    def to_json(self) -> dict:
        return {"ok": True, "bundle": str(self.path), "blobs": self.blobs, "bytes": self.bytes,
                "new_blobs": self.new_blobs, "new_rows": self.new_rows,
                "staged": [dict(r.__dict__) for r in self.staged]}

    def render(self) -> str:
        rows = [(r.repo, r.requested, r.target, r.commit[:12], r.variant) for r in self.staged]
        done = (f"wrote {self.path}" if self.new_blobs is None else
                f"imported {self.path}: {self.new_blobs} new blob(s), {self.new_rows} new staged row(s)")
        return (table(["repo", "requested", "target", "commit", "variant"], rows)
                + f"\n{done}; {self.blobs} blobs, {human_bytes(self.bytes)}")


class _Hashing:
    """A reader that hashes what passes through it: sha256, and the git blob sha1 that small
    files are known by (its header needs the size up front: a wrong size shows as a wrong oid)."""

    def __init__(self, f, size: int):
        self.f, self.seen = f, 0
        self.h256, self.hgit = hashlib.sha256(), hashlib.sha1(f"blob {size}\0".encode())

    def read(self, n: int = CHUNK) -> bytes:
        chunk = self.f.read(n)
        self.h256.update(chunk)
        self.hgit.update(chunk)
        self.seen += len(chunk)
        return chunk

    def digest(self) -> Digest:
        return Digest(self.h256.hexdigest(), self.hgit.hexdigest(), self.seen)


# -- bundle ---------------------------------------------------------------------------------

def bundle(out: Path, home: Home, targets: list[str] | None = None) -> BundleReport:
    ledger = home.ledger
    rows = staged_rows(ledger)
    for t in targets or []:
        if not any(r.target == t for r in rows):
            raise BadInput(f"nothing is staged for {t}: run 'frt-mirror stage --target {t}' first")
    rows = [r for r in rows if not targets or r.target in targets or r.is_model]  # models: every target's
    if not rows:
        raise BadInput("nothing is staged: run 'frt-mirror stage' first")
    if not out.parent.is_dir():
        raise BadInput(f"{out.parent} is not a directory")
    store, recorded = home.store, {d.sha256: d for d in all_blobs(ledger)}
    with ledger.view() as v:
        files = {(r.repo, r.commit, r.variant): v.variant(r.repo, r.commit, r.variant)[0] for r in rows}
    blobs = blob_for(ledger, (f for fs in files.values() for f in fs))
    needed: dict[str, Digest] = {}
    for (repo, commit, _), entries in files.items():
        for f in entries:
            sha = blobs[f]
            if sha not in recorded or not store.has(sha):
                raise BundleRejected(f"{repo}@{commit[:12]}: {f.path} has no verified blob in the store: "
                                     "run 'frt-mirror verify', then 'frt-mirror stage' again")
            needed[sha] = recorded[sha]
    blobs = [needed[k] for k in sorted(needed)]
    doc = {"format": FORMAT, "created": utcnow().isoformat(), "frt_mirror": dist_version("frt-mirror"),
           "blobs": [{"sha256": d.sha256, "size": d.size, "git_oid": d.git_oid} for d in blobs],
           "repos": [repo_record(ledger, repo) for repo in sorted({r.repo for r in rows})],
           "staged": [dict(r.__dict__) for r in rows],
           # The upstream's trustedKernelPublisher per org, so `serve` on the other side repeats it.
           "publishers": [p.to_json() for p in ledger.publishers({r.repo.split("/", 1)[0] for r in rows}).values()]}
    _write_tar(out, doc, blobs, store)
    return BundleReport(out, len(blobs), sum(d.size for d in blobs), rows)


def _write_tar(out: Path, doc: dict, blobs: list[Digest], store: BlobStore) -> None:
    tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex}.tmp")
    mtime = int(time.time())

    def info(name: str, size: int) -> tarfile.TarInfo:
        ti = tarfile.TarInfo(name)
        ti.size, ti.mtime, ti.mode = size, mtime, 0o444
        return ti

    try:
        # Plain tar, no compression: kernels are mostly compiled .so files that barely compress,
        # and an uncompressed tar streams at disk speed on both sides of the gap.
        with open(tmp, "wb") as f:
            with tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as tf:
                data = json.dumps(doc, indent=1, sort_keys=True).encode()
                tf.addfile(info(MANIFEST, len(data)), io.BytesIO(data))  # first: read before any blob
                for d in blobs:
                    with open(store.path(d.sha256), "rb") as src:
                        reader = _Hashing(src, d.size)
                        tf.addfile(info(f"blobs/{d.sha256}", d.size), reader)
                    if reader.digest() != d:  # better caught here, where it can be re-staged
                        raise BundleRejected(f"stored blob {d.sha256} is corrupt: run 'frt-mirror verify'")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
        fsync_dir(out.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# -- import ---------------------------------------------------------------------------------

def import_bundle(src: Path, home: Home) -> BundleReport:
    ledger, store = home.ledger, home.store
    store.sweep_parts("*.import-*.part")  # left by a killed import; a running one's are recent
    parts: dict[str, Path | None] = {}  # sha -> its .part in tmp/ (None: already in the store)
    try:
        listed, repos, staged, publishers = _read_and_verify(src, store, parts)
    except BaseException as e:
        for p in parts.values():
            if p is not None:
                p.unlink(missing_ok=True)
        if isinstance(e, (tarfile.TarError, EOFError)):
            e = f"truncated or not a tar archive ({e})"
        elif not isinstance(e, (BundleRejected, OSError)):
            raise
        raise BundleRejected(f"{src}: {e}; nothing was imported") from None
    # Everything verified: store, then ledger, then views, then the staged rows that point at them.
    for sha, part in parts.items():
        if part is not None:
            store.commit(part, listed[sha])
    record_blobs(ledger, listed.values())
    for repo in repos:
        merge_repo_record(ledger, repo.repo, repo_type=repo.repo_type, endpoint=repo.endpoint,
                          scanned_at=repo.scanned_at, refs=repo.refs, commits=repo.commits,
                          listings=repo.listings, builds=repo.builds)
    for pub in publishers:
        ledger.record_publisher(pub.org, pub.trusted, endpoint=pub.endpoint, seen_at=pub.seen_at)
    views = home.views
    for row, pairs in staged:
        if not row.is_model:  # models have no view (frt.mirror.models)
            views.link(row.repo, row.commit, row.variant, pairs)
    have = set(staged_rows(ledger))
    new = [row for row, _ in staged if row not in have]
    record_staged_rows(ledger, new)
    return BundleReport(src, len(listed), sum(d.size for d in listed.values()), [r for r, _ in staged],
                        new_blobs=sum(p is not None for p in parts.values()), new_rows=len(new))


def _read_and_verify(src: Path, store: BlobStore, parts: dict[str, Path | None]):
    with tarfile.open(src, mode="r:") as tf:
        members = iter(tf)
        first = next(members, None)
        if first is None or first.name != MANIFEST or first.type not in _REGULAR or first.size > MAX_MANIFEST:
            raise BundleRejected(f"the first member must be a regular file named {MANIFEST}")
        try:
            listed, repos, staged, publishers = _check_manifest(json.loads(tf.extractfile(first).read()))
        except BadInput as e:  # the gate's line names the value and where it sits
            raise BundleRejected(f"malformed {MANIFEST}: {e}") from None
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
            raise BundleRejected(f"malformed {MANIFEST}: {type(e).__name__}: {e}") from None
        for m in members:
            _verify_member(tf, m, listed, parts, store)
        missing = sorted(set(listed) - set(parts))
        if missing:
            raise BundleRejected(f"{len(missing)} listed blob(s) missing from the archive, e.g. {missing[0]}")
        # A tar cut off exactly between members reads as complete: require its end-of-archive marker.
        tf.fileobj.seek(tf.offset)
        if tf.fileobj.read(2 * tarfile.BLOCKSIZE) != bytes(2 * tarfile.BLOCKSIZE):
            raise BundleRejected("no end-of-archive marker: the archive is truncated")
    return listed, repos, staged, publishers


def _verify_member(tf: tarfile.TarFile, m: tarfile.TarInfo, listed: dict[str, Digest],
                   parts: dict[str, Path | None], store: BlobStore) -> None:
    """Stream one `blobs/<sha256>` member into tmp/ (or nowhere, if the store has it), hashing it."""
    match = _BLOB.fullmatch(m.name)
    if match is None or m.type not in _REGULAR:
        raise BundleRejected(f"unexpected member {m.name!r} (only regular files {MANIFEST}, blobs/<sha256>)")
    sha = match[1]
    if sha not in listed or sha in parts:
        raise BundleRejected(f"blob {sha} " + ("appears twice" if sha in parts else f"is not in {MANIFEST}"))
    want = listed[sha]
    if m.size != want.size:  # refused before a byte of it lands in tmp/
        raise BundleRejected(f"blob {sha} is {m.size} bytes in the archive, listed as {want.size}")
    parts[sha] = None if store.has(sha) else store.part_path(f"{sha}.import-{uuid.uuid4().hex}")
    reader = _Hashing(tf.extractfile(m), m.size)
    with open(parts[sha], "wb") if parts[sha] else contextlib.nullcontext() as out:
        while chunk := reader.read():
            if out is not None:
                out.write(chunk)
    if (got := reader.digest()) != want:
        raise BundleRejected(f"blob {sha} is tampered or damaged: expected sha256 {want.sha256}, "
                             f"content hashes to {got.sha256} ({got.size} bytes)")


@dataclass
class _RepoRows:
    """One repo's ledger rows from a bundle, parsed and validated before anything is written."""

    repo: str
    repo_type: str
    endpoint: str | None
    scanned_at: datetime | None
    refs: dict[tuple[str, str], str]
    commits: list[dict]  # rows of the commits table, less repo_pk
    listings: dict[str, list[str]]  # head -> the upstream's listing of its history, newest first
    builds: dict[str, list[VariantInfo]]  # sha -> its build listing, for scanned commits


def _check_manifest(doc: dict):
    """Validate everything that will reach the ledger or a path on disk, so that once the blobs
    verify, writing cannot fail half-way on content. Returns the listed blobs, the repos' rows,
    and per staged row its files paired with the blob each one is."""
    if doc["format"] not in READS:
        raise ValueError(f"bundle format {doc['format']!r}; this frt-mirror reads formats "
                         f"{', '.join(map(str, READS))}")
    json.dumps(doc, ensure_ascii=False).encode()  # a lone surrogate would fail later, inside SQLite
    listed = {}
    for b in doc["blobs"]:
        sha = check_sha256(b["sha256"], where="blobs")
        listed[sha] = Digest(sha, check_git_oid(b["git_oid"], where="blobs"), _int(b["size"], 0))
    _need(len(listed) == len(doc["blobs"]), "a blob is listed twice")
    repos = [_parse_repo(r) for r in doc["repos"]]
    variants = {(r.repo, sha, v.name): v.files for r in repos for sha, vs in r.builds.items() for v in vs}
    by_oid = {d.git_oid: d for d in listed.values()}
    staged = []
    for s in doc["staged"]:
        # Its repo, commit and variant become view paths (its revision, a cache ref: see _request).
        row = StagedRow(*(s[k] for k in StagedRow.__dataclass_fields__))
        where = f"staged row of {check_repo_id(row.repo, where='staged')!r}"
        check_commit(row.commit, where=where)
        check_variant(row.variant, where=where)
        model = row.is_model and row.variant == MODEL_SELECTION
        pulled = row.target == PULLED + row.variant  # serve --upstream's: for whichever target accepts it
        _need(_request(row).label == row.requested and (model or pulled or str(parse_target(row.target)) == row.target),
              f"bad staged row {s}")
        files = variants.get((row.repo, row.commit, row.variant))
        _need(files, f"staged {row.repo}@{row.commit[:12]} {row.variant} has no build listing")
        pairs = []
        for f in files:
            # An LFS file's git oid is its pointer's, not its content's: match those by sha256.
            blob = listed.get(f.sha256) if f.sha256 else by_oid.get(f.git_oid)
            _need(blob is not None and blob.size == f.size, f"{row.repo}: {f.path} has no listed blob")
            pairs.append((f, blob.sha256))
        staged.append((row, pairs))
    publishers = [_parse_publisher(p) for p in doc.get("publishers", [])]  # absent in older bundles
    return listed, repos, staged, publishers


def _parse_publisher(p: dict) -> PublisherInfo:
    _need(type(p["trusted"]) is bool and isinstance(p["endpoint"], (str, type(None)))
          and isinstance(p["seen_at"], str), f"bad publisher {p}")
    return PublisherInfo(check_org(p["org"], where="publishers"), p["trusted"], p["endpoint"],
                         _when(p["seen_at"]))


def _parse_repo(d: dict) -> _RepoRows:
    where = f"repo {check_repo_id(d['repo'], where='repos')}"
    _need(d["repo_type"] in ("kernel", "model") and isinstance(d["endpoint"], (str, type(None))),
          f"{d['repo']}: bad repo type or endpoint")
    refs = {}
    for r in d["refs"]:
        _need(r["kind"] in ("branch", "tag"), f"bad ref {r}")
        name = check_ref(r["name"], where=where, what=f"{r['kind']} name")  # a file name in an exported cache
        refs[(r["kind"], name)] = check_commit(r["commit"], where=where, what=f"{r['kind']} {name!r} target")
    commits, builds, parents = [], {}, {}
    for c in d["commits"]:
        sha = check_commit(c["sha"], where=where)
        _need(isinstance(c["title"], str), f"bad commit {sha!r}")
        commits.append({"sha": sha, "depth": _int(c["depth"], -1), "title": c["title"], "date": _when(c["date"])})
        if "parent" in c:  # format 1 kept the upstream's list as parent links
            parents[sha] = None if c["parent"] is None else check_commit(c["parent"], where=where, what="parent")
        if c["variants"] is not None:
            builds[c["sha"]] = [_parse_variant(v, f"{where}@{c['sha'][:12]}", model=d["repo_type"] == "model")
                                for v in c["variants"]]
    if "listings" in d:
        _need(isinstance(d["listings"], dict), f"{where}: bad listings")
        listings = {check_commit(head, where=where, what="listed head"):
                    [check_commit(sha, where=where, what="listed commit") for sha in shas]
                    for head, shas in d["listings"].items()}
        known = {c["sha"] for c in commits}
        _need(all(set(shas) <= known for shas in listings.values()), f"{where}: a listing names an unknown commit")
    else:
        listings = {head: parent_chain(parents, head) for head in set(refs.values())}
    return _RepoRows(d["repo"], d["repo_type"], d["endpoint"], _when(d["scanned_at"]), refs, commits,
                     {head: shas for head, shas in listings.items() if shas}, builds)


def _parse_variant(v: dict, where: str, model: bool = False) -> VariantInfo:
    name = check_variant(v["name"], where=where)
    _need(not model or name == MODEL_SELECTION, f"{where}: a model's selection is {MODEL_SELECTION!r}, not {name!r}")
    _need(isinstance(v["metadata"], (dict, type(None))) and isinstance(v["metadata_oid"], (str, type(None))),
          f"{name}: bad metadata")
    files = []
    for f in v["files"]:
        # A kernel's lands in views/…/build/<variant>/; a model's only in an exported cache's snapshot.
        check_path(f["path"], where=where, under="" if model else f"build/{name}/")
        sha256 = None if f["sha256"] is None else check_sha256(f["sha256"], where=where)
        oid = check_git_oid(f["git_oid"], where=where)
        files.append(FileEntry(f["path"], _int(f["size"], 0), oid, sha256))
    return VariantInfo(name, tuple(files), v["metadata_oid"], v["metadata"])


def _int(value, low: int) -> int:
    _need(type(value) is int and low <= value < 1 << 62, f"bad number {value!r}")  # SQLite's integer range
    return value


def _when(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def _need(ok, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _request(row: StagedRow) -> Request:
    if row.version is not None:
        return Request(row.repo, version=_int(row.version, 0))
    check_ref(row.revision, where=f"staged row of {row.repo!r}", what="revision")  # refs/<it> in a Hub cache
    return Request(row.repo, revision=row.revision, pinned=row.requested.startswith("pin "))
