"""A repo's commits on record as the matrix and bisect take them, whichever way the ledger was read: through
SQLAlchemy (ledger.view.LedgerView) or with sqlite3 alone (read_repo, under ledger_file.quick_read), for
`matrix` on a small home, which must not pay for importing SQLAlchemy."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .archs import Declared


@dataclass(frozen=True)
class CommitRow:
    sha: str
    date: datetime | None
    title: str
    scanned: bool
    variants: list[str]
    no_digest: list[str] = field(default_factory=list)  # variants whose metadata.json has no publisher digest


class RepoRecords:
    """One repo's refs, commits and what each build declares, read whole in one snapshot: the reads that
    build_matrix makes of a LedgerView, answered alike (tests/test_matrix_start_up.py holds them equal)."""

    def __init__(
        self,
        repo_id: str,
        known: bool,
        refs: list[tuple[str, str, str]],
        commits: list[CommitRow],
        declared: dict[str, dict[str, Declared]],
    ):
        self.repo_id, self._known, self._refs, self._commits, self._declared = repo_id, known, refs, commits, declared
        self._by_sha = {c.sha: c for c in commits}

    def _check(self, repo_id: str) -> None:
        if repo_id != self.repo_id:  # one repo was read: asking of another is a caller's mistake
            raise KeyError(f"read {self.repo_id}, asked of {repo_id}")

    def known(self, repo_id: str) -> bool:
        self._check(repo_id)
        return self._known

    def refs(self, repo_id: str) -> list[tuple[str, str, str]]:
        """Live refs as (kind, name, commit sha), branches then tags, by name."""
        self._check(repo_id)
        return self._refs

    def commits(self, repo_id: str) -> list[CommitRow]:
        """Every recorded commit, newest first, with its variant names."""
        self._check(repo_id)
        return self._commits

    def variant_names(self, repo_id: str, sha: str) -> tuple[str, ...] | None:
        """The variant names at a commit, or None when its build/ listing was never recorded."""
        self._check(repo_id)
        c = self._by_sha.get(sha)
        return tuple(c.variants) if c is not None and c.scanned else None

    def declared(self, repo_id: str, sha: str) -> dict[str, Declared]:
        self._check(repo_id)
        return self._declared.get(sha, {})

    def declared_all(self, repo_id: str) -> None:
        """Read already, with everything else."""
        self._check(repo_id)


def read_repo(conn: sqlite3.Connection, repo_id: str) -> RepoRecords:
    """`repo_id`'s records from a SQLite ledger, in LedgerView's orders (its queries, as SQLite runs them)."""
    rows = conn.execute(
        "SELECT repos.id, refs.kind, refs.name, refs.commit_sha FROM repos "
        "LEFT OUTER JOIN refs ON refs.repo_pk = repos.id AND refs.gone = 0 "
        "WHERE repos.repo_id = ? ORDER BY refs.kind, refs.name",
        (repo_id,),
    ).fetchall()
    pk = rows[0][0] if rows else None
    # LIKE, as SQLAlchemy's contains() renders it: the same answer where a document spells it otherwise.
    found = conn.execute(
        "SELECT commits.sha, commits.date, commits.title, commits.scanned, variants.name, "
        "variants.metadata_json LIKE '%' || ? || '%', variants.metadata_json FROM commits "
        "LEFT OUTER JOIN variants ON variants.commit_pk = commits.id WHERE commits.repo_pk = ? "
        "ORDER BY commits.date DESC NULLS LAST, commits.depth DESC, commits.sha, variants.name",
        ('"digest"', pk),
    ).fetchall()
    # SQLite keeps a date as ISO text, which SQLAlchemy parses as fromisoformat does.
    commits = commit_rows((c[0], datetime.fromisoformat(c[1]) if c[1] else None, *c[2:6]) for c in found)
    declared = declared_by_commit((sha, name, doc) for sha, *_, name, _digest, doc in found if name is not None)
    refs = [(kind, name, sha) for _, kind, name, sha in rows if kind is not None]
    return RepoRecords(repo_id, pk is not None, refs, commits, declared)


def commit_rows(rows: Iterable[Sequence[Any]]) -> list[CommitRow]:
    """Commits from (sha, date, title, scanned, variant name or None, has a digest) rows, in their order."""
    out: dict[str, CommitRow] = {}
    for sha, date, title, scanned, name, digest in rows:
        row = out.setdefault(sha, CommitRow(sha, date, title, bool(scanned), []))
        if name is not None:
            row.variants.append(name)
            if not digest:
                row.no_digest.append(name)
    return list(out.values())


def declared_by_commit(rows: Iterable[Sequence[Any]]) -> dict[str, dict[str, Declared]]:
    """sha -> variant -> what its metadata.json declares, from (sha, variant name, metadata.json) rows."""
    out: dict[str, dict[str, Declared]] = {}
    for sha, name, doc in rows:
        out.setdefault(sha, {})[name] = Declared.of(json.loads(doc) if doc else None)
    return out
