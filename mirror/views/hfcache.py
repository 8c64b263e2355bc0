"""export-cache: a Hugging Face Hub cache in which `HF_HUB_OFFLINE=1` really works.

`kernels` cannot produce one itself (DESIGN.md): it writes no `refs/vN`, and the tree
listing huggingface_hub caches (`trees/<sha>.json`) names files of other variants,
so the offline snapshot lookup raises IncompleteSnapshotError. Here every staged
version gets its `refs/vN`, snapshots hold only staged files (relative symlinks to
`blobs/<etag>`, as huggingface_hub lays them out), and no tree listing is written —
an old one for an exported commit is removed. Exported into a folder it wrote before, the folder follows
the home: what was withdrawn since goes (hfcache_prune.py).

Every file is hashed before the first write, and linked only if its bytes still hash to the blob the
ledger recorded: a stored blob changed on disk since it was verified (bit rot, an edit) is refused,
naming it, with `out` untouched. A blob already in `out` is kept only if it is that very file.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from frt.resolver.errors import BadInput, VerificationFailed
from frt.resolver.fs import atomic_write
from frt.resolver.gate import check_commit, check_git_oid, check_path, check_ref, check_repo_id, check_sha256
from frt.resolver.resolution import FileEntry
from frt.resolver.targets import Target

from ..store.blobs import digest_file
from ..store.home import Home
from ..store.records import MODEL_TARGET, StagedRow, blob_for, repo_types
from .hfcache_prune import Wanted, prune, read_record, write_record

# Per staged row, its files and the refs to write for it (_checked), before the first write.
Plan = list[tuple[StagedRow, tuple[tuple[FileEntry, ...], list[str]]]]
# (repo, commit, path) -> where a file's bytes lie (None: nowhere; _check_sources refuses it).
Sources = dict[tuple[str, str, str], Path | None]
# A stored blob (by sha256) as a file to read and link: the store's own, or an object's fetched beside `out`.
BlobFile = Callable[[str], Path]

CACHEDIR_TAG = "Signature: 8a477f597d28d172789f06886806bc55\n"


def cache_folder(repo_id: str, repo_type: str = "kernel") -> str:
    org, name = repo_id.split("/", 1)
    return f"{repo_type}s--{org}--{name}"


@dataclass(frozen=True)
class Exported:
    refs: list[tuple[str, str, str]]  # (repo, ref, commit) of every ref written
    removed: list[tuple[str, str, str]]  # (repo, ref, commit) of every ref taken out: no longer staged


def export_cache(
    out: Path, home: Home, target: Target, wheels_to: Path | None = None, *, keep: bool = False
) -> Exported:
    """Write the cache for `target`, and for the targets exported into `out` before, into `out`; unless
    `keep`, take out what the home no longer stages for them (hfcache_prune.py). The wheels its kernels'
    python-depends need go to `wheels_to` (see export_wheels)."""
    targets, folders = read_record(out)
    targets = list(dict.fromkeys([str(target), *targets]))
    # Models have no targets: every target's cache gets every staged model.
    models = home.staged(MODEL_TARGET)
    mine = home.staged(str(target))
    if not mine + models:
        raise BadInput(f"nothing is staged for {target}: run 'frt-mirror stage --target {target}' first")
    rows = mine + [r for t in targets[1:] for r in home.staged(t)] + models
    plan = []
    for row in rows:  # every name checked before the first write: a bad one leaves `out` untouched
        with home.ledger.view() as v:
            files, _ = v.variant(row.repo, row.commit, row.variant)
            # Staged by its commit (pulled through, or pinned): the refs the ledger knows at that commit
            # too, so an offline client asking for `main` (as it asked the mirror) finds it.
            at = (
                [name for _kind, name, sha in v.refs(row.repo) if sha == row.commit]
                if row.revision == row.commit
                else []
            )
        plan.append((row, _checked(row, files, at)))
    with contextlib.ExitStack() as scratch:
        blob_file: BlobFile
        if (blob_files := home.store.files) is not None:
            blob_file = blob_files.path
        else:  # objects: each blob fetched beside `out` first (hard-linked in after)
            out.mkdir(parents=True, exist_ok=True)
            fetched = Path(tempfile.mkdtemp(prefix=".frt-export-", dir=out))
            scratch.callback(shutil.rmtree, fetched, True)
            blob_file = functools.partial(_fetched_blob, home, fetched)
        return _export(out, home, (targets, folders), plan, rows, mine + models, wheels_to, keep, blob_file)


def _export(
    out: Path,
    home: Home,
    record: tuple[list[str], list[str]],
    plan: Plan,
    rows: list[StagedRow],
    with_wheels: list[StagedRow],
    wheels_to: Path | None,
    keep: bool,
    blob_file: BlobFile,
) -> Exported:
    """export_cache's writing, once `plan` is made: from the views, or (a home without) the blobs' files."""
    targets, folders = record
    sources = _sources(home, plan, blob_file)
    blobs = _check_sources(home, plan, sources)
    wheels = _check_wheels(home, with_wheels, blob_file) if wheels_to is not None else []
    out.mkdir(parents=True, exist_ok=True)
    if not (out / "CACHEDIR.TAG").exists():
        (out / "CACHEDIR.TAG").write_text(CACHEDIR_TAG)
    written, types = [], repo_types(home.ledger, rows)
    wanted: dict[str, Wanted] = {}  # repo folder -> what it holds after this export
    for row, (files, refs) in plan:
        folder = cache_folder(row.repo, types[row])
        want = wanted.setdefault(folder, Wanted(row.repo))
        for entry in files:
            src = sources[(row.repo, row.commit, entry.path)]
            assert src is not None  # _check_sources refused a missing one
            # huggingface_hub names a blob by the ETag the Hub sends: sha256 for LFS files, git oid otherwise.
            etag = entry.sha256 or entry.git_oid
            _place(out / folder, row.commit, entry.path, src, etag=etag, sha256=blobs[entry])
            want.files.setdefault(row.commit, set()).add(entry.path)
            want.blobs.add(etag)
        (out / folder / "trees" / f"{row.commit}.json").unlink(missing_ok=True)
        for ref in refs:
            atomic_write(out / folder / "refs" / ref, row.commit)
            want.refs.add(ref)
            written.append((row.repo, ref, row.commit))
    removed = [] if keep else prune(out, wanted, [*folders, *wanted])
    write_record(out, targets, sorted({*folders, *wanted}))
    if wheels and wheels_to is not None:  # wheels is empty without wheels_to
        wheels_to.mkdir(parents=True, exist_ok=True)
        for name, src, sha in wheels:
            _copy_in(src, wheels_to / name, sha)
    return Exported(list(dict.fromkeys(written)), removed)


def wheels_needed(home: Home, target: Target) -> list[str]:
    return sorted({w for r in home.staged(str(target)) for w in r.wheels})


def _check_wheels(home: Home, rows: Iterable[StagedRow], blob_file: BlobFile) -> list[tuple[str, Path, str]]:
    """(filename, stored blob, sha256) of every wheel the rows need, each re-hashed before the first write:
    a find-links folder is another thing pip on the cluster trusts without a hash."""
    from ..store.records import wheel_rows

    needed = sorted({w for r in rows for w in r.wheels})
    recorded = wheel_rows(home.ledger, needed)
    out = []
    for name in needed:
        check_path(name, where="ledger's wheel record")
        sha = recorded.get(name, (None, None, None, None))[2]
        src = blob_file(sha) if sha else None
        out.append((name, *_checked_source(f"wheel {name}", src, sha, "store")))
    return out


def _fetched_blob(home: Home, fetched: Path, sha: str) -> Path:
    """A stored object fetched into `fetched` (once), verified."""
    if not (dest := fetched / sha).exists():
        from .materialise import fetch_blob

        fetch_blob(home, sha, dest, f"blob {sha}")
    return dest


def _sources(home: Home, plan: Plan, blob_file: BlobFile) -> Sources:
    """Where each file's bytes lie: a kernel's in its view (what `kernels` loads), a model's in the
    store (models have no view; see frt.mirror.stage.models); in a home without views, every one a blob's."""
    out: Sources = {}
    views = home.views
    blobs = blob_for(home.ledger, (f for row, (files, _) in plan if row.is_model or views is None for f in files))
    for row, (files, _) in plan:
        for f in files:
            if row.is_model or views is None:
                out[(row.repo, row.commit, f.path)] = blob_file(sha) if (sha := blobs[f]) else None
            else:
                out[(row.repo, row.commit, f.path)] = views.root / views.repo_folder(row.repo) / row.commit / f.path
    return out


def _check_sources(home: Home, plan: Plan, sources: Sources) -> dict[FileEntry, str]:
    """Every file to be linked is there and still hashes to its recorded blob, before the first write:
    clients (and `kernels` offline) check no hash, so a changed byte would be loaded on the cluster.
    Each file's blob (sha256), for _place."""
    blobs = blob_for(home.ledger, (f for _, (files, _) in plan for f in files))
    checked: dict[FileEntry, str] = {}
    for row, (files, _) in plan:
        for entry in files:
            src, sha = sources[(row.repo, row.commit, entry.path)], blobs[entry]
            where = f"{row.repo}@{row.commit[:12]}: {entry.path}"
            checked[entry] = _checked_source(where, src, sha, "store" if row.is_model else "view")[1]
    return checked


def _checked_source(what: str, src: Path | None, sha: str | None, held_in: str) -> tuple[Path, str]:
    """A file export-cache is about to copy or link, and its blob: there, and still hashing to it."""
    if src is None or not src.is_file() or sha is None:
        raise BadInput(
            f"{what} is recorded as staged but missing from the {held_in}: run 'frt-mirror verify', then "
            "'frt-mirror stage' again"
        )
    if (got := digest_file(src).sha256) != sha:
        raise VerificationFailed(
            f"{what}: {src} hashes to {got}, not to its recorded blob {sha}: its bytes changed on disk; "
            "nothing was written: run 'frt-mirror verify'"
        )
    return src, sha


def _holds(blob: Path, src: Path, sha256: str) -> bool:
    """Does the cache's `blob` already hold the verified bytes? The very file hashed above, or an older
    copy (another filesystem) that hashes right; a link to a file since quarantined does not."""
    if not blob.exists():
        return False
    return os.path.samefile(blob, src) or digest_file(blob).sha256 == sha256


def _checked(row: StagedRow, files: tuple[FileEntry, ...], at: list[str]) -> tuple[tuple[FileEntry, ...], list[str]]:
    """The row's files and ref names (its own, then `at`), through the gate: each becomes a path under
    `out` (blobs/<etag>, snapshots/<commit>/<path>, refs/<ref>), and the ledger is only a file on disk."""
    where = f"ledger's staged row {check_repo_id(row.repo, where='ledger')}@{row.commit[:12]}"
    check_commit(row.commit, where=where)
    for entry in files:
        check_path(entry.path, where=where, under="" if row.is_model else f"build/{row.variant}/")
        if entry.sha256:  # the blob's name: the ETag, as below
            check_sha256(entry.sha256, where=where)
        else:
            check_git_oid(entry.git_oid, where=where)
    own = f"v{row.version}" if row.version is not None else row.revision
    refs = [check_ref(r, where=where, what="revision") for r in dict.fromkeys([own, *at]) if r and r != row.commit]
    return files, refs


def _copy_in(src: Path, dest: Path, sha256: str) -> None:
    """`dest` holds `src`'s verified bytes: kept if it already does, else a link (or copy) renamed in."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if not _holds(dest, src, sha256):
        tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}.tmp")
        try:
            os.link(src, tmp)  # same filesystem: free; else copy
        except OSError:
            import shutil

            shutil.copyfile(src, tmp)
        os.replace(tmp, dest)


def _place(repo_dir: Path, commit: str, path: str, src: Path, *, etag: str, sha256: str) -> None:
    blob = repo_dir / "blobs" / etag
    _copy_in(src, blob, sha256)
    link = repo_dir / "snapshots" / commit / path
    link.parent.mkdir(parents=True, exist_ok=True)
    target = os.path.relpath(blob, link.parent)
    if link.is_symlink() and os.readlink(link) == target:
        return
    tmp_link = link.with_name(f".{link.name}.{uuid.uuid4().hex}.tmp")
    os.symlink(target, tmp_link)
    os.replace(tmp_link, link)
