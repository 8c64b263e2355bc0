"""What the mirror serves: an in-memory index of the staged, verified set, built from the ledger.

Only staged commits are revisions here, and only staged files are entries. Everything a
request needs (sha, sizes, oids, the blob path, the org's trust, the bearer tokens) is precomputed,
so HEAD never hashes and a request never touches the ledger: a ledger that is down costs serve
nothing it had loaded (watch.py keeps the last good catalog).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..store.home import Home
from ..store.records import blob_for, repo_types, staged_rows, wheel_rows
from .tokens import token_hashes

if TYPE_CHECKING:
    from collections.abc import Iterable

    from frt.resolver.ledger.view import LedgerView

    from ..store.records import StagedRow

VERSION_BRANCH = re.compile(r"v\d+")


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The git-lfs pointer file the Hub stores in git for a large file; its oid is the tree `oid`."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


RawHeaders = Sequence[tuple[bytes, bytes]]  # an answer's headers as Starlette sends them: (name, value) bytes


@dataclass(frozen=True)
class ServedFile:
    path: str
    size: int
    oid: str  # git oid as upstream listed it (for LFS files: the pointer's)
    sha256: str  # of the content: names the blob in the store
    lfs: bool
    blob: Path | None  # None: listed upstream, not stored yet (pull-through fetches it on a GET)

    @property
    def stored_blob(self) -> Path:
        """`blob`, where the file is known to be stored: what reads its bytes (never a listed-only file's)."""
        if self.blob is None:  # a caller's bug, said as one (an assert is gone under python -O)
            raise LookupError(f"{self.path}: listed, not stored")
        return self.blob

    def tree_entry(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"type": "file", "oid": self.oid, "size": self.size, "path": self.path}
        if self.lfs:
            entry["lfs"] = {
                "oid": self.sha256,
                "size": self.size,
                "pointerSize": len(lfs_pointer(self.sha256, self.size)),
            }
        return entry


@dataclass
class ServedCommit:
    sha: str
    date: datetime | None
    title: str
    files: dict[str, ServedFile] = field(default_factory=dict)

    def dirs(self) -> set[str]:
        out: set[str] = set()
        for p in self.files:
            parts = p.split("/")[:-1]
            out.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
        return out


@dataclass
class ServedRepo:
    repo_id: str
    repo_type: str
    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    commits: dict[str, ServedCommit] = field(default_factory=dict)
    # For /commits: what the upstream listed as each staged commit's history, staged commits only (every id the
    # mirror lists must resolve here, or a client walking it, e.g. a mirror staging from this one,
    # fails on the first unstaged one), and every recorded commit's date and title.
    logs: dict[str, list[str]] = field(default_factory=dict)
    meta: dict[str, tuple[datetime | None, str]] = field(default_factory=dict)
    # Version branches the ledger knows (a scan upstream) at commits not staged here: a kernels client is
    # told of them, so that its ask for one reaches serve and is counted (serve/demand.py).
    unstaged: dict[str, str] = field(default_factory=dict)

    def resolve(self, rev: str) -> str | None:
        """A branch, a tag or a full sha, to a staged commit; also the full ref names the Hub takes
        (`refs/heads/v1`, `refs/tags/v1.0.0`: what `kernels versions` sends, from `/refs`' `ref`).
        Other refs (`refs/pr/N`, `refs/convert/…`) are never staged: None, as for any unknown name."""
        if rev.startswith("refs/"):
            kind, _, name = rev[5:].partition("/")
            sha = {"heads": self.branches, "tags": self.tags}.get(kind, {}).get(name)
        else:
            sha = self.branches.get(rev) or self.tags.get(rev) or (rev if len(rev) == 40 else None)
        return sha if sha in self.commits else None

    def unstaged_version(self, rev: str) -> str | None:
        """The version branch (`v2`) `rev` names or points at, where it is known but not staged here."""
        return next((name for name, sha in self.unstaged.items() if rev in (name, sha)), None)

    def default(self) -> str:
        """The commit `GET /api/{t}s/{repo}` (no revision) describes: `main` where it is staged, else the
        newest staged commit. The Hub answers that route for every repo that exists; a 404 there makes
        `repo_exists` raise RevisionNotFoundError instead of returning True (main often is not staged)."""
        newest = max(self.commits.values(), key=lambda c: (c.date is not None, c.date, c.sha))
        return self.resolve("main") or newest.sha


@dataclass
class Catalog:
    repos: dict[tuple[str, str], ServedRepo]
    publishers: dict[str, bool]  # org -> the upstream's trustedKernelPublisher, as recorded
    trust_override: frozenset[str] = frozenset()  # serve --trust: the operator's word, not the upstream's
    tokens: frozenset[str] = frozenset()  # sha256 of serve's bearer tokens (none: open to every client)
    # The wheels staged rows need (python-depends), for /simple/: project -> filename -> its stored file
    wheels: dict[str, dict[str, ServedFile]] = field(default_factory=dict)
    # Blobs the staged rows need that the store does not hold (their files are not served): (missing, needed)
    unheld: tuple[int, int] = (0, 0)

    def publisher_trusted(self, org: str) -> bool | None:
        """What to answer for the org's overview; None: the upstream never told us (404)."""
        return True if org in self.trust_override else self.publishers.get(org)

    def repo(self, repo_type: str, repo_id: str) -> ServedRepo | None:
        return self.repos.get((repo_type, repo_id))

    def staged_as(self, repo_type: str, repo_id: str) -> str:
        """For a repo asked for under a type it is not staged as: where it is (the URL's prefix), said
        after "not staged on this mirror"; "" when it is staged under no other type either."""
        other = sorted(t for t, r in self.repos if r == repo_id and t != repo_type)
        if not other:
            return ""
        where = " and ".join(f"a {t} ({'' if t == 'model' else t + 's/'}{repo_id})" for t in other)
        return f" as a {repo_type}; it is staged as {where}"


def load_catalog(home: Home, trust_override: frozenset[str] = frozenset()) -> Catalog:
    ledger, store = home.ledger, home.store
    rows = staged_rows(ledger)
    repos: dict[tuple[str, str], ServedRepo] = {}
    with ledger.view() as v:
        entries = {}
        for r in rows:
            if (r.repo, r.commit, r.variant) not in entries:
                entries[(r.repo, r.commit, r.variant)] = v.variant(r.repo, r.commit, r.variant)[0]
        blobs = blob_for(ledger, (f for fs in entries.values() for f in fs))
        stored = store.stored_of({sha for sha in blobs.values() if sha})  # only verified bytes are served
        types = repo_types(ledger, rows)
        for repo_type, repo_id in sorted({(types[r], r.repo) for r in rows}):
            served = repos[(repo_type, repo_id)] = ServedRepo(repo_id, repo_type)
            commits = v.commits(repo_id)
            served.meta = {c.sha: (c.date, c.title) for c in commits}
            meta = {c.sha: c for c in commits}
            for (rid, sha, _variant), files in entries.items():
                if rid != repo_id:
                    continue
                c = meta.get(sha)
                commit = served.commits.setdefault(sha, ServedCommit(sha, c.date if c else None, c.title if c else ""))
                for f in files:
                    content = blobs[f]
                    if content in stored:
                        commit.files[f.path] = ServedFile(
                            f.path, f.size, f.git_oid, content, f.sha256 is not None, store.locator(content)
                        )
            add_refs(v, served, [r for r in rows if r.repo == repo_id])
    publishers = {org: p.trusted for org, p in ledger.publishers().items()}
    needed = {sha for sha in blobs.values() if sha}
    unheld = (len(needed - stored), len(needed))
    return Catalog(repos, publishers, frozenset(trust_override), token_hashes(ledger), _wheels(home, rows), unheld)


def _wheels(home: Home, rows: Iterable[StagedRow]) -> dict[str, dict[str, ServedFile]]:
    out: dict[str, dict[str, ServedFile]] = {}
    for name, (project, _version, sha, size) in wheel_rows(home.ledger, {w for r in rows for w in r.wheels}).items():
        if home.store.has(sha):  # only verified bytes are served
            out.setdefault(project, {})[name] = ServedFile(name, size, "", sha, True, home.store.locator(sha))
    return out


def add_refs(view: LedgerView, served: ServedRepo, rows: Iterable[StagedRow], upstream: bool = False) -> None:
    """Branches v<N> as staged (what `kernels` resolves), plus upstream refs that point at staged commits.
    `upstream` (pull-through): the upstream's refs as last seen win over what was staged under a name."""
    for kind, name, sha in view.refs(served.repo_id):
        if sha in served.commits:
            (served.branches if kind == "branch" else served.tags)[name] = sha
        elif kind == "branch" and VERSION_BRANCH.fullmatch(name) and not upstream:
            served.unstaged[name] = sha
    for r in sorted(rows, key=lambda r: r.commit):
        if r.version is not None and not (upstream and f"v{r.version}" in served.branches):
            served.branches[f"v{r.version}"] = r.commit
        elif r.revision and r.revision != r.commit and not r.revision.startswith(r.commit[:7]):
            served.branches.setdefault(r.revision, r.commit)
    for name in [n for n in served.unstaged if n in served.branches]:  # staged under that name after all
        del served.unstaged[name]
    for sha in served.commits:
        served.logs[sha] = [h for h in view.history(served.repo_id, sha) or () if h in served.commits] or [sha]


def etag_of(f: ServedFile) -> str:
    return f.sha256 if f.lfs else f.oid


def dir_oid(commit: str, path: str) -> str:
    return hashlib.sha1(f"{commit}:{path}".encode()).hexdigest()
