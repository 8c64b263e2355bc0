"""Withdrawals follow the tiers (issue 48): what the upstream stopped answering goes here too.

A region's mirror pulls through from central; central unstages activation v2. Central's refs no longer
name v2, and the region's next refs refresh marks its v2 gone (Ledger.record_refs). Before this module the
region still served v2: its pulled staged row named the version, and every commit recorded with a listing
stayed servable by sha. Now:

- `withdrawn_commits`: the commits reachable only from refs the upstream dropped (their recorded histories,
  less every live ref's history and every commit a remaining staged row names) are not served;
- `withdraw_pulled`: the rows pull-through staged (target PULLED+variant) at those commits are unstaged
  as `unstage` does (remembered as withdrawn, so an older bundle imported here does not bring them back:
  store/withdrawn.py), their views dropped.

Rows an operator staged here (`stage`, `import`) are the operator's: kept, and their commits served.
A ref that moved (v1 rebuilt) is not a withdrawal: its older commits stay in its history, servable.
"""

from __future__ import annotations

import contextlib

from sqlalchemy import select

from frt.resolver.ledger import Ledger
from frt.resolver.ledger.schema import Ref, Repo
from frt.resolver.ledger.view import LedgerView

from ..store.home import Home
from ..store.lock import store_collector
from ..store.records import PULLED, StagedRow, staged_rows
from ..store.unstage import unstage_rows


def _gone_heads(ledger: Ledger, repo_id: str) -> set[str]:
    """The commits the upstream's dropped refs of `repo_id` pointed at, as last seen."""
    q = select(Ref.commit_sha).join(Repo, Repo.id == Ref.repo_pk).where(Repo.repo_id == repo_id, Ref.gone)
    with ledger.session(write=False) as s:
        return set(s.scalars(q))


def withdrawn_commits(
    ledger: Ledger, repo_id: str, rows: list[StagedRow], pulled_only: bool = False, view: LedgerView | None = None
) -> set[str]:
    """Commits of `repo_id` only the upstream's dropped refs reached. `rows`: the staged rows, whose
    commits are kept (`pulled_only`: but those pull-through staged, which follow the upstream). `view`:
    the caller's open view of the ledger, read in that one snapshot."""
    gone = _gone_heads(ledger, repo_id)
    if not gone:
        return set()
    with contextlib.nullcontext(view) if view is not None else ledger.view() as v:
        dropped = {c for sha in gone for c in (v.history(repo_id, sha) or [sha])}
        live = {c for _, _, sha in v.refs(repo_id) for c in (v.history(repo_id, sha) or [sha])}
    kept = {r.commit for r in rows if r.repo == repo_id and not (pulled_only and r.target.startswith(PULLED))}
    return dropped - live - kept


def withdraw_pulled(home: Home, repo_id: str) -> list[StagedRow]:
    """Unstage the pulled rows of `repo_id` at commits the upstream withdrew; the rows unstaged."""
    rows = staged_rows(home.ledger)
    gone = withdrawn_commits(home.ledger, repo_id, rows, pulled_only=True)
    chosen = [r for r in rows if r.repo == repo_id and r.target.startswith(PULLED) and r.commit in gone]
    if chosen:
        with store_collector(home):  # no fetch is linking the views this removes
            unstage_rows(home, chosen)
    return chosen
