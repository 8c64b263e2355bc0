"""The LOCAL_KERNELS view: build/<variant> trees of hard links into the blob store's files (a home whose
blobs are objects has none), and the find-links folder of python-depends' wheels, hard links too.

A view directory appears complete or not at all: it is assembled under views/.tmp
and renamed into place. Commits are immutable, so two stagers building the same
view build the same thing; whoever renames second discards its copy.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..home_path import HomeLayout

if TYPE_CHECKING:
    from frt.resolver.resolution import FileEntry

    from .files import FileBlobStore
    from .records import WheelRecord


def repo_folder(repo_id: str) -> str:
    org, name = repo_id.split("/", 1)
    return f"{org}--{name}"


def _remove_tree(path: Path) -> None:
    import shutil  # here, not at the top: its compression modules cost `env` 3 ms of start-up

    shutil.rmtree(path, ignore_errors=True)


def wheels_dir(home_root: Path) -> Path:
    """The flat find-links folder of a home (wheels of python-depends): hard links into its store."""
    return HomeLayout(home_root).wheels


class Views:
    def __init__(self, home: Path, store: FileBlobStore):
        self.root = HomeLayout(home).views
        self.tmp = HomeLayout(home).views_tmp
        self.wheels = wheels_dir(home)
        self.store = store

    repo_folder = staticmethod(repo_folder)

    def variant_dir(self, repo_id: str, commit: str, variant: str) -> Path:
        """What LOCAL_KERNELS points at: a variant dir, so kernels loads exactly this build."""
        return self.root / repo_folder(repo_id) / commit / "build" / variant

    def is_complete(self, repo_id: str, commit: str, files: list[tuple[FileEntry, str]]) -> bool:
        return all(self.is_link_to(self.root / repo_folder(repo_id) / commit / f.path, sha) for f, sha in files)

    def is_link_to(self, path: Path, sha256: str) -> bool:
        """Is `path` blob `sha256`'s file (a hard link to it)? False where either is missing."""
        try:
            return os.path.samefile(path, self.store.path(sha256))
        except OSError:
            return False

    def link(
        self,
        repo_id: str,
        commit: str,
        variant: str,
        files: list[tuple[FileEntry, str]],
        check: Callable[[Path], list[str]] | None = None,
    ) -> list[str]:
        """Hard-link a variant's verified blobs into its view. `check` judges the laid-out variant dir
        before it becomes visible; its problems are returned and nothing is put in place."""
        final = self.variant_dir(repo_id, commit, variant)
        if self.is_complete(repo_id, commit, files):
            return []
        self.tmp.mkdir(parents=True, exist_ok=True)
        scratch = self.tmp / uuid.uuid4().hex
        prefix = f"build/{variant}/"
        for f, sha in files:
            dest = scratch / f.path[len(prefix) :] if f.path.startswith(prefix) else scratch / f.path
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.link(self.store.path(sha), dest)
        if check is not None and (problems := check(scratch)):
            _remove_tree(scratch)
            return problems
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.exists():  # incomplete (a user removed files): set it aside, then replace it
            stale = self.tmp / f"stale-{uuid.uuid4().hex}"
            try:
                os.rename(final, stale)
                _remove_tree(stale)
            except FileNotFoundError:
                pass
        try:
            os.rename(scratch, final)
        except OSError:  # another stager put the same view in place first
            _remove_tree(scratch)
        return []

    def files(self) -> list[Path]:
        return sorted(p for p in self.root.rglob("*") if p.is_file()) if self.root.exists() else []

    def remove(self, repo: str, commit: str, variant: str) -> int | None:
        """Take a variant's view out of sight in one rename, then delete it and the folders it leaves
        empty. The number of files it held, or None where there was none."""
        final = self.variant_dir(repo, commit, variant)
        if not final.is_dir():
            return None
        self.tmp.mkdir(parents=True, exist_ok=True)
        aside = self.tmp / f"stale-{uuid.uuid4().hex}"
        os.rename(final, aside)
        files = sum(len(names) for _, _, names in os.walk(aside))
        _remove_tree(aside)
        parent = final.parent
        while parent != self.root and parent.is_relative_to(self.root):
            try:
                parent.rmdir()  # only when empty: another variant of the commit keeps it
            except OSError:
                break
            parent = parent.parent
        return files

    def sweep_tmp(self, older_than_s: float = 600) -> None:
        """Scratch dirs of interrupted runs hold only hard links; dropping them loses nothing.
        Recent ones may belong to a stager still running, so they stay."""
        if self.tmp.exists():
            cutoff = time.time() - older_than_s
            for p in self.tmp.iterdir():
                if p.stat().st_mtime < cutoff:
                    _remove_tree(p)

    def link_wheels(self, wheels: Sequence[WheelRecord]) -> None:
        """Hard-link each stored wheel (a WheelRecord: filename, sha256) into the home's find-links folder
        under its name, atomically: a link made beside it and renamed over, so pip never sees half an entry."""
        if not wheels:
            return
        self.wheels.mkdir(parents=True, exist_ok=True)
        for w in wheels:
            dest = self.wheels / w.filename
            if self.is_link_to(dest, w.sha256):
                continue
            tmp = self.wheels / f".{w.filename}.{uuid.uuid4().hex}.tmp"
            tmp.unlink(missing_ok=True)
            os.link(self.store.path(w.sha256), tmp)
            os.replace(tmp, dest)
