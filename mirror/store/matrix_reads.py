"""A repo's matrix as `matrix` shows it from a home: its default columns (the targets its variants name,
resolver.matrix, and those it is staged for, here); read with sqlite3 alone where the ledger allows it
(quick_matrix: no SQLAlchemy to import); and decided ahead by whoever records variants
(remember_matrices), so that the first `matrix` after a stage or a scan finds every answer of kernels'
it needs kept (resolver.decisions_memo) and imports no kernels either."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from typing import TYPE_CHECKING

from frt.resolver.commit_records import read_repo
from frt.resolver.decisions_memo import memo
from frt.resolver.matrix import Matrix, build_matrix
from frt.resolver.targets import Target, parse_target

from .staged import MODEL_TARGET, PULLED

if TYPE_CHECKING:
    from .home import Home


def staged_columns(targets: Iterable[str]) -> list[Target]:
    """The kernel targets among a repo's staged rows' targets, by name: a model's row names none, nor does
    a variant pulled through serve (it was asked for by no target)."""
    return [parse_target(t) for t in sorted({t for t in targets if t != MODEL_TARGET and not t.startswith(PULLED)})]


def quick_matrix(home: Home, repo: str, targets: list[Target] | None) -> Matrix | None:
    """build_matrix of `repo` on what one sqlite3 read of the home's ledger gives (Home.quick); None where
    the ledger's own path answers: its cases (a ledger server, another schema, …), a repo it does not
    record (whose error names the near ones), a model repo (it has files, not variants)."""
    read = home.quick(lambda conn: (read_repo(conn, repo), _staged_targets(conn, repo)))
    if read is None:
        return None
    records, staged = read
    if not records.known(repo) or MODEL_TARGET in staged:
        return None
    return build_matrix(records, repo, targets, also=staged_columns(staged))


def _staged_targets(conn: sqlite3.Connection, repo: str) -> list[str]:
    return [t for (t,) in conn.execute("SELECT DISTINCT target FROM staged WHERE repo_id = ?", (repo,))]


def remember_matrices(home: Home, repos: Iterable[str]) -> None:
    """Decide now (kernels is imported already) what `matrix` of each repo asks of kernels: its default
    columns, kernels' picks by name there; and keep the answers, for every later process."""
    staged = home.staged()
    with home.ledger.view() as view:
        for repo in sorted(set(repos)):
            targets = [r.target for r in staged if r.repo == repo]
            if view.known(repo) and MODEL_TARGET not in targets:
                build_matrix(view, repo, also=staged_columns(targets))
    memo().save()
