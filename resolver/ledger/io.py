"""A repo's whole record in the ledger, out and back in: what a bundle carries across an air gap.

Out: refs, the commits and the upstream's listing of each head's history, and the build listing of every
scanned commit — not only the staged variants, so that `resolve --offline` and `matrix` answer on the other
side as they do here. In: merged by the ledger's own rules (refs only if newer; a build-only commit row gains
its history; listings only where missing), so no other layer touches the ledger's rows.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, cast

from sqlalchemy import insert, select
from sqlalchemy.orm import selectinload

from ..resolution import VariantInfo
from . import Ledger
from .dialect import insert_for
from .retry import retried
from .schema import Commit, Listing, Ref, Repo, Variant


@retried
def repo_record(ledger: Ledger, repo_id: str) -> dict[str, Any]:
    """All the ledger knows of a repo: refs, history, and the build listing of every scanned
    commit — not only the staged variants, so that `resolve --offline` and `matrix` answer on the
    other side as they do here, and a commit's listing there is never a partial one."""
    with ledger.session(write=False) as s:
        repo = cast(Repo, s.scalar(select(Repo).where(Repo.repo_id == repo_id)))  # a repo the ledger holds
        refs = s.scalars(select(Ref).where(Ref.repo_pk == repo.id, ~Ref.gone).order_by(Ref.kind, Ref.name))
        commits = s.scalars(
            select(Commit)
            .where(Commit.repo_pk == repo.id)
            .order_by(Commit.depth, Commit.sha)
            .options(selectinload(Commit.variants).selectinload(Variant.files))
        )
        listings: dict[str, list[str]] = {}
        for head, sha in s.execute(
            select(Listing.head, Listing.sha).where(Listing.repo_pk == repo.id).order_by(Listing.head, Listing.position)
        ):
            listings.setdefault(head, []).append(sha)
        return {
            "repo": repo_id,
            "repo_type": repo.repo_type,
            "endpoint": repo.endpoint,
            "scanned_at": repo.scanned_at and repo.scanned_at.isoformat(),
            "refs": [{"kind": r.kind, "name": r.name, "commit": r.commit_sha} for r in refs],
            "listings": listings,
            "commits": [
                {
                    "sha": c.sha,
                    "depth": c.depth,
                    "title": c.title,
                    "date": c.date and c.date.isoformat(),
                    "variants": [
                        {
                            "name": v.name,
                            "metadata_oid": v.metadata_oid,
                            "metadata": json.loads(v.metadata_json) if v.metadata_json else None,
                            "files": [
                                {"path": f.path, "size": f.size, "git_oid": f.git_oid, "sha256": f.sha256}
                                for f in v.files
                            ],
                        }
                        for v in c.variants
                    ]
                    if c.scanned
                    else None,
                }
                for c in commits
            ],
        }


def merge_repo_record(
    ledger: Ledger,
    repo: str,
    *,
    repo_type: str,
    endpoint: str | None,
    scanned_at: datetime | None,
    refs: dict[tuple[str, str], str],
    commits: list[dict[str, Any]],
    listings: dict[str, list[str]],
    builds: dict[str, list[VariantInfo]],
) -> None:
    """Merge a repo's rows from elsewhere (a bundle, already validated): refs only if it saw upstream
    later than this ledger did; commits, history listings and build listings only where missing
    (a commit, and so what it reaches, never changes)."""
    with ledger.session(write=False) as s:
        mine = s.execute(select(Repo.id, Repo.scanned_at).where(Repo.repo_id == repo)).first()
    if mine is None or (scanned_at and (mine.scanned_at is None or mine.scanned_at < scanned_at)):
        ledger.record_refs(repo, refs, endpoint=endpoint, repo_type=repo_type)
        with ledger.session() as s:  # when upstream was seen, not when the bundle arrived
            row = cast(Repo, s.scalar(select(Repo).where(Repo.repo_id == repo)))  # record_refs made it
            row.scanned_at = scanned_at
    with ledger.session() as s:
        pk = s.scalar(select(Repo.id).where(Repo.repo_id == repo))
        if commits:
            stmt = insert_for(s)(Commit)
            s.execute(
                stmt.on_conflict_do_update(  # as record_history: a build-only row gains its history
                    index_elements=["repo_pk", "sha"],
                    where=(Commit.depth < 0) & (stmt.excluded.depth >= 0),
                    set_={k: stmt.excluded[k] for k in ("depth", "date", "title")},
                ),
                [dict(c, repo_pk=pk) for c in commits],
            )
        listed = set(s.scalars(select(Listing.head).where(Listing.repo_pk == pk).distinct()))
        rows = [
            {"repo_pk": pk, "head": head, "position": i, "sha": sha}
            for head, shas in listings.items()
            if head not in listed
            for i, sha in enumerate(shas)
        ]
        if rows:
            s.execute(insert(Listing), rows)
        scanned = set(s.scalars(select(Commit.sha).where(Commit.repo_pk == pk, Commit.scanned)))
    builds = {sha: vs for sha, vs in builds.items() if sha not in scanned}
    if builds:
        ledger.record_builds(repo, builds)
