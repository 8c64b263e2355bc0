"""export-cache into a folder it wrote before: the folder follows the home, withdrawals included.

A cache that only ever grew kept what the home has since withdrawn (an incremental bundle's removal, an
`unstage`): `refs/v2` and its snapshot stayed, and `HF_HUB_OFFLINE=1 get_kernel(version=2)` still loaded
it. So export-cache keeps a record in the folder, `.frt-export.json`: the targets exported into it and the
repo folders it wrote. Each export writes what the home stages for all of those targets, then removes, in
the folders it wrote and nowhere else, every ref, snapshot file and blob that is no longer wanted. Per repo
the refs go first: a client that resolves a ref while this runs finds its snapshot, or no ref at all.
`--keep` only adds. Folders export-cache never wrote (another tool's) are left alone.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from frt.resolver.fs import atomic_write

RECORD = ".frt-export.json"


@dataclass
class Wanted:
    """What one repo folder of the cache should hold after an export."""

    repo: str
    refs: set[str] = field(default_factory=set)
    files: dict[str, set[str]] = field(default_factory=dict)  # commit -> snapshot paths
    blobs: set[str] = field(default_factory=set)  # blob names (ETags)


def read_record(out: Path) -> tuple[list[str], list[str]]:
    """(targets, repo folders) an earlier export recorded in `out`; nothing for a folder without one, or
    with one this version cannot read (then only what this export writes is pruned)."""
    try:
        doc = json.loads((out / RECORD).read_text())
        targets, folders = doc["targets"], doc["folders"]
    except (OSError, ValueError, KeyError, TypeError):
        return [], []
    if not all(isinstance(x, str) for x in [*targets, *folders]):
        return [], []
    return targets, [f for f in folders if "/" not in f and f not in ("", ".", "..")]


def write_record(out: Path, targets: list[str], folders: list[str]) -> None:
    atomic_write(out / RECORD, json.dumps({"targets": sorted(targets), "folders": sorted(folders)}, indent=1))


def prune(out: Path, wanted: dict[str, Wanted], folders: list[str]) -> list[tuple[str, str, str]]:
    """Remove from each of `folders` what `wanted` does not name; (repo, ref, commit) of each ref removed."""
    removed: list[tuple[str, str, str]] = []
    for folder in sorted(set(folders)):
        repo_dir = out / folder
        if not repo_dir.is_dir() or repo_dir.is_symlink():
            continue
        want = wanted.get(folder) or Wanted(_repo_of(folder))
        removed += _prune_refs(repo_dir, want)
        _prune_snapshots(repo_dir, want)
        _prune_blobs(repo_dir, want)
        if folder not in wanted:
            shutil.rmtree(repo_dir, ignore_errors=True)
    return removed


def _repo_of(folder: str) -> str:
    parts = folder.split("--", 2)
    return f"{parts[1]}/{parts[2]}" if len(parts) == 3 else folder


def _prune_refs(repo_dir: Path, want: Wanted) -> list[tuple[str, str, str]]:
    refs, removed = repo_dir / "refs", []
    for ref in sorted(p for p in refs.rglob("*") if p.is_file() or p.is_symlink()) if refs.is_dir() else []:
        name = ref.relative_to(refs).as_posix()
        if name not in want.refs:
            try:
                commit = ref.read_text().strip()
            except OSError:
                commit = ""
            ref.unlink(missing_ok=True)
            removed.append((want.repo, name, commit))
    _drop_empty_dirs(refs)
    return removed


def _prune_snapshots(repo_dir: Path, want: Wanted) -> None:
    snapshots = repo_dir / "snapshots"
    if not snapshots.is_dir():
        return
    for commit_dir in snapshots.iterdir():
        paths = want.files.get(commit_dir.name)
        if paths is None:
            shutil.rmtree(commit_dir, ignore_errors=True) if commit_dir.is_dir() else commit_dir.unlink()
            continue
        for f in commit_dir.rglob("*"):
            if (f.is_file() or f.is_symlink()) and f.relative_to(commit_dir).as_posix() not in paths:
                f.unlink(missing_ok=True)
        _drop_empty_dirs(commit_dir)


def _prune_blobs(repo_dir: Path, want: Wanted) -> None:
    blobs = repo_dir / "blobs"
    for blob in blobs.iterdir() if blobs.is_dir() else []:
        if blob.name not in want.blobs:
            blob.unlink(missing_ok=True)


def _drop_empty_dirs(root: Path) -> None:
    """Empty folders below `root`, deepest first (a withdrawn variant's build/<variant>/ in a kept commit)."""
    for d in sorted((p for p in root.rglob("*") if p.is_dir() and not p.is_symlink()), key=lambda p: -len(p.parts)):
        try:
            d.rmdir()
        except OSError:
            pass
