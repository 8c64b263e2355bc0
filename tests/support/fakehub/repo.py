"""An in-memory, git-like repository model for the fake Hub.

Each commit holds a full snapshot of its tree. Advertised metadata (git blob oid, sha256, size) is
computed once at commit time and kept apart from the bytes that are served, so a test can tamper
with served bytes afterwards (`set_file_bytes`) while the tree keeps advertising the originals —
exactly the situation a verifying mirror must catch.

A file's content is bytes, or a read-only `mmap` of a file on disk (tests/support/big_model.py): hashed
and served from the page cache, never copied into the heap, so a repo of many GiB costs no memory here.
"""

from __future__ import annotations

import hashlib
import heapq
import mmap
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

_SHA_RE = re.compile(r"^[0-9a-f]{40}$")
# Fake clock: every commit of a repo is one minute after the previous one, so dates (and the
# newest-first order derived from them) are stable from run to run.
_EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def git_blob_oid(data: bytes | mmap.mmap) -> str:
    """git's object id of a blob: sha1(b"blob <len>\\0" + data). The Hub's `oid` for files."""
    h = hashlib.sha1(b"blob %d\0" % len(data))
    h.update(data)
    return h.hexdigest()


def sha256(data: bytes | mmap.mmap) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class FileMeta:
    """What the Hub advertises about a file (tree, paths-info, resolve headers)."""

    oid: str  # git blob sha1
    sha256: str
    size: int

    @classmethod
    def of(cls, data: bytes | mmap.mmap) -> FileMeta:
        return cls(git_blob_oid(data), sha256(data), len(data))


@dataclass
class Commit:
    sha: str
    parents: list[str]  # first parent first; two for a merge
    title: str
    message: str
    date: datetime
    authors: list[str] = field(default_factory=lambda: ["fixture-bot"])
    files: dict[str, bytes | mmap.mmap] = field(default_factory=dict)  # served bytes, full snapshot
    meta: dict[str, FileMeta] = field(default_factory=dict)  # advertised, fixed at commit time

    def dirs(self) -> set[str]:
        """Every directory implied by the file paths (git has no empty directories)."""
        out: set[str] = set()
        for p in self.files:
            parts = p.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                out.add("/".join(parts[:i]))
        return out

    def dir_oid(self, path: str) -> str:
        """A stable stand-in for git's tree oid: sha1 over the (path, oid) pairs below `path`."""
        prefix = path + "/" if path else ""
        h = hashlib.sha1(b"tree\0")
        for p in sorted(self.meta):
            if p.startswith(prefix):
                h.update(f"{p}\0{self.meta[p].oid}\n".encode())
        return h.hexdigest()


class FakeRepo:
    def __init__(self, repo_id: str, repo_type: str = "kernel"):
        self.repo_id = repo_id
        self.repo_type = repo_type
        self.commits: dict[str, Commit] = {}
        self.branches: dict[str, str] = {}
        self.tags: dict[str, str] = {}
        # branch -> [old head, info answers left]: see force_push(stale_for=...)
        self.stale: dict[str, list] = {}

    @property
    def author(self) -> str:
        return self.repo_id.split("/")[0]

    def commit(
        self,
        changes: dict[str, bytes | mmap.mmap | None],
        *,
        title: str,
        branch: str = "main",
        message: str = "",
        date: datetime | None = None,
        authors: list[str] | None = None,
        merge: str | None = None,
    ) -> str:
        """Commit `changes` on top of `branch` (a root commit if it does not exist yet).

        A value of None deletes the path; a key ending in "/" (value None) deletes everything under it.
        `merge=REF`: a merge commit, its second parent REF's head (its tree is `branch`'s plus `changes`:
        resolve the merge in `changes`).
        """
        parent = self.branches.get(branch)
        parents = [p for p in (parent, merge and self._must_resolve(merge)) if p]
        files = dict(self.commits[parent].files) if parent else {}
        meta = dict(self.commits[parent].meta) if parent else {}
        for path, data in changes.items():
            if path.endswith("/"):
                for p in [p for p in files if p.startswith(path)]:
                    del files[p], meta[p]
            elif data is None:
                files.pop(path, None)
                meta.pop(path, None)
            else:
                path = path.strip("/")
                files[path] = data if isinstance(data, mmap.mmap) else bytes(data)
                meta[path] = FileMeta.of(files[path])
        h = hashlib.sha1(f"parent {' '.join(parents)}\ntitle {title}\n".encode())
        for p in sorted(meta):
            h.update(f"{meta[p].oid} {p}\n".encode())
        sha = h.hexdigest()
        if date is None:
            date = _EPOCH + timedelta(minutes=len(self.commits))
        self.commits[sha] = Commit(
            sha=sha,
            parents=parents,
            title=title,
            message=message,
            date=date,
            authors=list(authors or ["fixture-bot"]),
            files=files,
            meta=meta,
        )
        self.branches[branch] = sha
        return sha

    def branch(self, name: str, from_ref: str) -> str:
        sha = self._must_resolve(from_ref)
        self.branches[name] = sha
        return sha

    def tag(self, name: str, ref: str) -> str:
        sha = self._must_resolve(ref)
        self.tags[name] = sha
        return sha

    def force_push(self, branch: str, new_head: str, *, stale_for: int = 0) -> str:
        """`git push --force`: point `branch` at `new_head` (a ref or sha: build the new history on a
        scratch branch first) and forget every commit no branch or tag reaches any more. Returns the
        old head.

        `stale_for=N`: the next N repo-info answers for `branch` (`/api/{t}s/{repo}` for main,
        `/revision/{branch}`) still name the old head, as the real Hub's `/revision/main` briefly can
        after a force-push (huggingface_hub#3406), while `/refs` already shows the new one and the old
        head's tree and files answer 404 RevisionNotFound. `repo.stale.clear()` ends it early.
        """
        old = self.branches[branch]
        self.branches[branch] = self._must_resolve(new_head)
        reachable = {c.sha for head in {*self.branches.values(), *self.tags.values()} for c in self.history(head)}
        old_commit = self.commits[old]
        for sha in [s for s in self.commits if s not in reachable]:
            del self.commits[sha]
        if stale_for > 0:
            self.stale[branch] = [old_commit, stale_for]
        return old

    def take_stale(self, rev: str) -> Commit | None:
        """The stale head to name for `rev` in one info answer, if force_push left one (counts down)."""
        entry = self.stale.get(rev)
        if entry is None:
            return None
        entry[1] -= 1
        if entry[1] <= 0:
            self.stale.pop(rev, None)
        return entry[0]

    def resolve_ref(self, rev: str) -> str | None:
        """Branch, then tag, then full 40-hex commit sha (as the Hub: no short shas)."""
        if rev in self.branches:
            return self.branches[rev]
        if rev in self.tags:
            return self.tags[rev]
        if _SHA_RE.match(rev) and rev in self.commits:
            return rev
        return None

    def history(self, sha: str) -> list[Commit]:
        """Commits reachable from `sha` through all parents, in `git log`'s default order, which the
        Hub's commit list follows: of the commits reached so far, the newest-dated comes next.
        Across a merge both sides interleave by date, so the next entry is not always a parent."""
        out, queued = [], {sha}
        heap = [(-self.commits[sha].date.timestamp(), 0, sha)]
        while heap:
            _, _, cur = heapq.heappop(heap)
            out.append(self.commits[cur])
            for p in self.commits[cur].parents:
                if p not in queued:
                    queued.add(p)
                    heapq.heappush(heap, (-self.commits[p].date.timestamp(), len(queued), p))
        return out

    def set_file_bytes(self, sha: str, path: str, data: bytes) -> None:
        """Serve `data` for `path` at commit `sha` from now on, keeping the advertised metadata."""
        c = self.commits[self._must_resolve(sha)]
        if path not in c.files:
            raise KeyError(path)
        c.files[path] = bytes(data)

    def _must_resolve(self, ref: str) -> str:
        sha = self.resolve_ref(ref)
        if sha is None:
            raise KeyError(f"unknown ref {ref!r} in {self.repo_id}")
        return sha
