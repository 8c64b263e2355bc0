"""Read snapshots of the ledger: what the resolver core, the matrix and serve's catalog ask of it."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Connection, bindparam, func, select

from ..archs import Declared
from ..commit_records import CommitRow, commit_rows, declared_by_commit
from ..resolution import FileEntry
from .schema import Commit, File, Listing, Ref, Repo, Variant

# The view's queries, built once: constructing a select() costs more than running it here.
_REPO_REFS = (
    select(Repo.id, Ref.kind, Ref.name, Ref.commit_sha)
    .outerjoin(Ref, (Ref.repo_pk == Repo.id) & ~Ref.gone)
    .where(Repo.repo_id == bindparam("repo"))
    .order_by(Ref.kind, Ref.name)
)
_SHA_PREFIX = (
    select(Commit.sha).where(Commit.repo_pk == bindparam("pk"), Commit.sha.startswith(bindparam("prefix"))).limit(2)
)
_VARIANT_NAMES = (
    select(Commit.scanned, Variant.name)
    .outerjoin(Variant, Variant.commit_pk == Commit.id)
    .where(Commit.repo_pk == bindparam("pk"), Commit.sha == bindparam("sha"))
    .order_by(Variant.name)
)
_VARIANT_FILES = (
    select(Variant.metadata_json, File.path, File.size, File.git_oid, File.sha256)
    .join(Commit, Variant.commit_pk == Commit.id)
    .outerjoin(File, File.variant_pk == Variant.id)
    .where(Commit.repo_pk == bindparam("pk"), Commit.sha == bindparam("sha"), Variant.name == bindparam("name"))
    .order_by(File.path)
)
_VARIANT_METADATA = (
    select(Variant.name, Variant.metadata_json)
    .join(Commit, Variant.commit_pk == Commit.id)
    .where(Commit.repo_pk == bindparam("pk"), Commit.sha == bindparam("sha"))
)
_REPO_METADATA = (
    select(Commit.sha, Variant.name, Variant.metadata_json)
    .join(Commit, Variant.commit_pk == Commit.id)
    .where(Commit.repo_pk == bindparam("pk"))
)
_ALL_COMMIT_VARIANTS = (
    select(Commit.sha, Commit.scanned, Variant.name)
    .outerjoin(Variant, Variant.commit_pk == Commit.id)
    .where(Commit.repo_pk == bindparam("pk"))
    .order_by(Commit.sha, Variant.name)
)
_LISTINGS = (
    select(Listing.head, Listing.sha).where(Listing.repo_pk == bindparam("pk")).order_by(Listing.head, Listing.position)
)

_COMMITS_NEWEST_FIRST = (
    select(
        Commit.sha, Commit.date, Commit.title, Commit.scanned, Variant.name, Variant.metadata_json.contains('"digest"')
    )
    .outerjoin(Variant, Variant.commit_pk == Commit.id)
    .where(Commit.repo_pk == bindparam("pk"))
    .order_by(Commit.date.desc().nulls_last(), Commit.depth.desc(), Commit.sha, Variant.name)
)


class LedgerView:
    """Read-only answers for the resolver core, inside one session (one consistent snapshot).

    This is the hot path of every offline resolve, so it runs a few joined Core queries
    on the session's connection and remembers their rows for the life of the view,
    rather than loading ORM objects (which cost ~10× more per resolve).
    """

    def __init__(self, conn: Connection):
        self._conn = conn
        self._repos: dict[str, tuple[int | None, list[tuple[str, str, str]]]] = {}
        self._names: dict[tuple[str, str], tuple[str, ...] | None] = {}
        self._listings: dict[str, dict[str, list[str]]] = {}
        self._declared: dict[tuple[str, str], dict[str, Declared]] = {}

    def _repo_row(self, repo_id: str) -> tuple[int | None, list[tuple[str, str, str]]]:
        """(repo pk, [(kind, name, sha)] of live refs), in one query."""
        if repo_id not in self._repos:
            rows = self._conn.execute(_REPO_REFS, {"repo": repo_id}).all()
            pk = rows[0][0] if rows else None
            self._repos[repo_id] = (pk, [(k, n, c) for _, k, n, c in rows if k is not None])
        return self._repos[repo_id]

    def repo_pk(self, repo_id: str) -> int | None:
        return self._repo_row(repo_id)[0]

    def known(self, repo_id: str) -> bool:
        return self.repo_pk(repo_id) is not None

    def repos(self) -> list[str]:
        """Every repo id the ledger records: what a mistyped one is compared with (repo_ids.closest)."""
        return list(self._conn.scalars(select(Repo.repo_id)))

    def refs(self, repo_id: str) -> list[tuple[str, str, str]]:
        """Live refs as (kind, name, commit sha), branches then tags, by name."""
        return self._repo_row(repo_id)[1]

    def versions(self, repo_id: str) -> dict[int, str]:
        """Branches named v<N> (what `kernels` calls versions; tags are ignored, as it does)."""
        out = {
            int(name[1:]): sha
            for kind, name, sha in self.refs(repo_id)
            if kind == "branch" and name[:1] == "v" and name[1:].isdigit()
        }
        return dict(sorted(out.items()))

    def commit_for(self, repo_id: str, revision: str) -> str | None:
        """A branch, a tag, a full sha, or an unambiguous sha prefix (≥ 7 hex digits)."""
        for _kind, name, sha in self.refs(repo_id):
            if name == revision:
                return sha
        rev = revision.lower()
        if len(rev) >= 7 and all(c in "0123456789abcdef" for c in rev):
            shas = self._conn.execute(_SHA_PREFIX, {"pk": self.repo_pk(repo_id), "prefix": rev}).scalars().all()
            if len(shas) == 1:
                return shas[0]
        return None

    def variant_names(self, repo_id: str, sha: str) -> tuple[str, ...] | None:
        """The variant names at a commit, or None when its build/ listing was never recorded."""
        key = (repo_id, sha)
        if key not in self._names:
            rows = self._conn.execute(_VARIANT_NAMES, {"pk": self.repo_pk(repo_id), "sha": sha}).all()
            self._names[key] = tuple(n for _, n in rows if n is not None) if rows and rows[0][0] else None
        return self._names[key]

    def variant(self, repo_id: str, sha: str, name: str) -> tuple[tuple[FileEntry, ...], dict[str, Any]]:
        rows = self._conn.execute(_VARIANT_FILES, {"pk": self.repo_pk(repo_id), "sha": sha, "name": name}).all()
        files = tuple(FileEntry(p, n, oid, h) for _, p, n, oid, h in rows if p is not None)
        return files, json.loads(rows[0][0]) if rows and rows[0][0] else {}

    def declared(self, repo_id: str, sha: str) -> dict[str, Declared]:
        """What each variant's metadata.json at a commit declares of its device code (backend type, archs):
        asked only for targets that name GPU archs."""
        key = (repo_id, sha)
        if key not in self._declared:  # a commit without variants has no row: {}
            rows = self._conn.execute(_VARIANT_METADATA, {"pk": self.repo_pk(repo_id), "sha": sha}).all()
            self._declared[key] = {name: Declared.of(json.loads(doc) if doc else None) for name, doc in rows}
        return self._declared[key]

    def declared_all(self, repo_id: str) -> None:
        """Read what every variant of the repo declares in one query (the matrix asks for every commit)."""
        rows = self._conn.execute(_REPO_METADATA, {"pk": self.repo_pk(repo_id)})
        for sha, declared in declared_by_commit(rows).items():
            self._declared[(repo_id, sha)] = declared

    def history(self, repo_id: str, sha: str) -> list[str] | None:
        """The commits the upstream listed as `sha`'s history (list_repo_commits(revision=sha)), newest
        first, in the upstream's order; None where it was never asked. Across merges that order is by
        date, so it says which commits `sha` reaches and roughly when, never which is whose parent.

        Only refusals, bisect and serve's /commits ask; the first ask loads the repo's listings and
        every commit's variant names, since a refusal then asks which of those commits has the target.
        """
        if repo_id not in self._listings:
            pk = self.repo_pk(repo_id)
            listings: dict[str, list[str]] = {}
            for head, c_sha in self._conn.execute(_LISTINGS, {"pk": pk}):
                listings.setdefault(head, []).append(c_sha)
            names: dict[str, list[str]] = {}
            for c_sha, scanned, vname in self._conn.execute(_ALL_COMMIT_VARIANTS, {"pk": pk}):
                bucket = names.setdefault(c_sha, []) if scanned else None
                if bucket is not None and vname is not None:
                    bucket.append(vname)
                self._names.setdefault((repo_id, c_sha), None)
            for c_sha, vnames in names.items():
                self._names[(repo_id, c_sha)] = tuple(vnames)
            self._listings[repo_id] = listings
        return self._listings[repo_id].get(sha)

    def commits(self, repo_id: str) -> list[CommitRow]:
        """Every recorded commit, newest first, with its variant names (for the matrix)."""
        return commit_rows(self._conn.execute(_COMMITS_NEWEST_FIRST, {"pk": self.repo_pk(repo_id)}))

    def commit_count(self, repo_id: str) -> int:
        return self._conn.execute(
            select(func.count()).select_from(Commit).where(Commit.repo_pk == self.repo_pk(repo_id))
        ).scalar_one()
