"""A bundle's manifest, checked before anything of it is written: everything that will reach the
ledger or a path on disk is validated here, so that once the blobs verify, writing cannot fail
half-way on content."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

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
from frt.resolver.ledger.rows import PublisherInfo
from frt.resolver.resolution import FileEntry, Request, VariantInfo, parent_chain
from frt.resolver.targets import parse_target

from ..store.blobs import Digest
from ..store.records import MODEL_SELECTION, PULLED, StagedRow, WheelRecord
from .format import READS, UNSTAGES, WHEELS
from .state import Base, check_state


@dataclass
class RepoRows:
    """One repo's ledger rows from a bundle, parsed and validated before anything is written."""

    repo: str
    repo_type: str
    endpoint: str | None
    scanned_at: datetime | None
    refs: dict[tuple[str, str], str]
    commits: list[dict[str, Any]]  # rows of the commits table, less repo_pk
    listings: dict[str, list[str]]  # head -> the upstream's listing of its history, newest first
    builds: dict[str, list[VariantInfo]]  # sha -> its build listing, for scanned commits


# Per staged row, its files paired with the blob each one is; a blob of None is one the bundle does not
# carry (an incremental bundle's base holds it), and a row of None pairs is a variant whose listing
# only the base carries: both are looked up in the home once it is known to hold the base.
Pairs = list[tuple[FileEntry, str | None]] | None


@dataclass
class Manifest:
    listed: dict[str, Digest]
    repos: list[RepoRows]
    staged: list[tuple[StagedRow, Pairs]]
    publishers: list[PublisherInfo]
    base: Base | None  # an incremental bundle's base
    unstaged: list[tuple[str, str, str]]  # (repo, requested, target): rows of the base this bundle takes away
    wheels: list[WheelRecord] = field(default_factory=list)  # python-depends' wheels the staged rows name
    created: datetime | None = None  # when the box wrote it (its clock): what was withdrawn since stays so


def check_manifest(doc: dict[str, Any]) -> Manifest:
    if doc["format"] not in READS:
        raise ValueError(f"bundle format {doc['format']!r}; this frt-mirror reads formats {', '.join(map(str, READS))}")
    json.dumps(doc, ensure_ascii=False).encode()  # a lone surrogate would fail later, inside SQLite
    base = doc.get("base")
    if base is not None:
        _need(isinstance(base, dict) and isinstance(base.get("name"), (str, type(None))), "bad base")
        check_sha256(base["id"], where="base")
        check_state(base["state"])
    listed = {}
    for b in doc["blobs"]:
        sha = check_sha256(b["sha256"], where="blobs")
        listed[sha] = Digest(sha, check_git_oid(b["git_oid"], where="blobs"), _int(b["size"], 0))
    _need(len(listed) == len(doc["blobs"]), "a blob is listed twice")
    based = base["state"]["repos"] if base else {}
    repos = [_parse_repo(r, based.get(r.get("repo"), {}).get("commits", {})) for r in doc["repos"]]
    variants = {(r.repo, sha, v.name): v.files for r in repos for sha, vs in r.builds.items() for v in vs}
    by_oid = {d.git_oid: d for d in listed.values()}
    staged: list[tuple[StagedRow, Pairs]] = []
    for s in doc["staged"]:
        row = _staged_row(s)
        files = variants.get((row.repo, row.commit, row.variant))
        if files is None and based.get(row.repo, {}).get("commits", {}).get(row.commit, [None, False])[1]:
            staged.append((row, None))  # the base carried this commit's build listing
            continue
        _need(files, f"staged {row.repo}@{row.commit[:12]} {row.variant} has no build listing")
        assert files is not None  # _need refused it
        pairs: list[tuple[FileEntry, str | None]] = []
        for f in files:
            # An LFS file's git oid is its pointer's, not its content's: match those by sha256.
            blob = listed.get(f.sha256) if f.sha256 else by_oid.get(f.git_oid)
            _need(
                (blob is None and base) or (blob is not None and blob.size == f.size),
                f"{row.repo}: {f.path} has no listed blob",
            )
            pairs.append((f, blob.sha256 if blob is not None else None))
        staged.append((row, pairs))
    publishers = [_parse_publisher(p) for p in doc.get("publishers", [])]  # absent in older bundles
    wheels = _wheels(doc, staged, listed, base)
    created = _created(doc.get("created"))
    return Manifest(listed, repos, staged, publishers, base, _unstaged(doc, base, staged), wheels, created)


def _created(value: object) -> datetime | None:
    if value is None:
        return None
    _need(isinstance(value, str) and len(value) <= 40, "bad created")
    assert isinstance(value, str)
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"bad created {value[:40]!r}") from None


def _wheel_names(names: Any) -> tuple[str, ...]:  # parsed JSON, checked here
    _need(isinstance(names, list) and all(isinstance(n, str) for n in names), f"bad wheels {str(names)[:80]}")
    for n in names:
        try:
            parse_wheel_filename(n)
        except InvalidWheelFilename:
            raise ValueError(f"bad wheel name {n[:80]!r}") from None
        check_path(n, where="wheels")  # it becomes views/wheels/<name>
    return tuple(names)


def _wheels(
    doc: dict[str, Any], staged: list[tuple[StagedRow, Pairs]], listed: dict[str, Digest], base: Base | None
) -> list[WheelRecord]:
    """The wheel records, each named by a row, its blob listed (or, incremental, its base's) with its size;
    every wheel a row names has one. Only format 5 may carry them."""
    records = doc.get("wheels", [])
    _need(isinstance(records, list) and (not records or doc["format"] >= WHEELS), "wheels in a bundle before format 5")
    out = {}
    for w in records:
        _need(
            isinstance(w, dict) and set(w) == {"filename", "project", "version", "sha256", "size"},
            f"bad wheel record {str(w)[:80]}",
        )
        name = _wheel_names([w["filename"]])[0]
        sha = check_sha256(w["sha256"], where="wheels")
        _need(isinstance(w["project"], str) and isinstance(w["version"], str), f"bad wheel record {name}")
        size = _int(w["size"], 0)
        blob = listed.get(sha)
        _need((blob is not None and blob.size == size) or (blob is None and base), f"wheel {name} has no listed blob")
        _need(name not in out, f"wheel {name} is listed twice")
        out[name] = WheelRecord(name, w["project"], w["version"], sha, size)
    for row, _ in staged:
        for name in row.wheels:
            _need(
                name in out, f"staged {row.repo} {row.variant} needs wheel {name}, which the bundle does not describe"
            )
    return list(out.values())


def _unstaged(
    doc: dict[str, Any], base: Base | None, staged: list[tuple[StagedRow, Pairs]]
) -> list[tuple[str, str, str]]:
    """An incremental bundle's removals: rows its base held (by the base's state, which the signature
    covers too) that it takes away; never one it also carries."""
    keys = doc.get("unstaged", [])
    if not keys:
        return []
    _need(base is not None and doc["format"] >= UNSTAGES, "removals ('unstaged') in a bundle with no base")
    assert base is not None  # _need refused None
    carried = {r.key for r, _ in staged}
    out = []
    for k in keys:
        _need(isinstance(k, list) and len(k) == 3 and all(isinstance(x, str) for x in k), f"bad unstaged row {k!r}")
        check_repo_id(k[0], where="unstaged")
        _need(json.dumps(k) in base["state"]["staged"], f"unstaged row {' '.join(k)!r} is not in the base")
        _need(tuple(k) not in carried, f"unstaged row {' '.join(k)!r} is staged by the same bundle")
        out.append(tuple(k))
    return out


def _staged_row(s: dict[str, Any]) -> StagedRow:
    # Its repo, commit and variant become view paths (its revision, a cache ref: see _request).
    fields = {k: s[k] for k in StagedRow.__dataclass_fields__ if k != "wheels"}
    row = StagedRow(**fields, wheels=_wheel_names(s.get("wheels", [])))
    where = f"staged row of {check_repo_id(row.repo, where='staged')!r}"
    check_commit(row.commit, where=where)
    check_variant(row.variant, where=where)
    model = row.is_model and row.variant == MODEL_SELECTION
    pulled = row.target == PULLED + row.variant  # serve --upstream's: for whichever target accepts it
    _need(
        _request(row).label == row.requested and (model or pulled or str(parse_target(row.target)) == row.target),
        f"bad staged row {s}",
    )
    return row


def _parse_publisher(p: dict[str, Any]) -> PublisherInfo:
    _need(
        type(p["trusted"]) is bool and isinstance(p["endpoint"], (str, type(None))) and isinstance(p["seen_at"], str),
        f"bad publisher {p}",
    )
    org = check_org(p["org"], where="publishers")
    seen_at = datetime.fromisoformat(p["seen_at"])  # a str (checked above): _when's None is not for it
    return PublisherInfo(org, p["trusted"], p["endpoint"], seen_at)


def _parse_repo(d: dict[str, Any], base_commits: dict[str, list[str | bool]]) -> RepoRows:
    """`base_commits`: the commits an incremental bundle's base holds of this repo, which its listings
    may name."""
    where = f"repo {check_repo_id(d['repo'], where='repos')}"
    _need(
        d["repo_type"] in ("kernel", "model", "dataset") and isinstance(d["endpoint"], (str, type(None))),
        f"{d['repo']}: bad repo type or endpoint",
    )
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
            builds[c["sha"]] = [
                _parse_variant(v, f"{where}@{c['sha'][:12]}", model=d["repo_type"] != "kernel") for v in c["variants"]
            ]
    if "listings" in d:
        _need(isinstance(d["listings"], dict), f"{where}: bad listings")
        listings = {
            check_commit(head, where=where, what="listed head"): [
                check_commit(sha, where=where, what="listed commit") for sha in shas
            ]
            for head, shas in d["listings"].items()
        }
        known = {c["sha"] for c in commits} | set(base_commits)
        _need(all(set(shas) <= known for shas in listings.values()), f"{where}: a listing names an unknown commit")
    else:
        listings = {head: parent_chain(parents, head) for head in set(refs.values())}
    return RepoRows(
        d["repo"],
        d["repo_type"],
        d["endpoint"],
        _when(d["scanned_at"]),
        refs,
        commits,
        {head: shas for head, shas in listings.items() if shas},
        builds,
    )


def _parse_variant(v: dict[str, Any], where: str, model: bool = False) -> VariantInfo:
    name = check_variant(v["name"], where=where)
    _need(not model or name == MODEL_SELECTION, f"{where}: a model's selection is {MODEL_SELECTION!r}, not {name!r}")
    _need(
        isinstance(v["metadata"], (dict, type(None))) and isinstance(v["metadata_oid"], (str, type(None))),
        f"{name}: bad metadata",
    )
    files = []
    for f in v["files"]:
        # A kernel's lands in views/…/build/<variant>/; a model's only in an exported cache's snapshot.
        check_path(f["path"], where=where, under="" if model else f"build/{name}/")
        sha256 = None if f["sha256"] is None else check_sha256(f["sha256"], where=where)
        oid = check_git_oid(f["git_oid"], where=where)
        files.append(FileEntry(f["path"], _int(f["size"], 0), oid, sha256))
    return VariantInfo(name, tuple(files), v["metadata_oid"], v["metadata"])


def _int(value: object, low: int) -> int:
    _need(type(value) is int and low <= value < 1 << 62, f"bad number {value!r}")  # SQLite's integer range
    assert isinstance(value, int)  # _need refused anything else
    return value


def _when(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def _need(ok: object, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _request(row: StagedRow) -> Request:
    if row.version is not None:
        return Request(row.repo, version=_int(row.version, 0))
    check_ref(row.revision, where=f"staged row of {row.repo!r}", what="revision")  # refs/<it> in a Hub cache
    return Request(row.repo, revision=row.revision, pinned=row.requested.startswith("pin "))
