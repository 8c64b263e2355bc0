"""The ledger's rows as the writers build them: a variant from its listing, a repo found or added, the
refusal upsert, and the publisher record as readers get it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from ..archs import declared_archs
from ..resolution import VariantInfo, declared_depends
from .dialect import InsertFn, cached
from .schema import File, RefusalRow, Repo, Variant


@dataclass(frozen=True)
class PublisherInfo:
    org: str
    trusted: bool
    endpoint: str | None
    seen_at: datetime

    def to_json(self) -> dict[str, Any]:
        return {
            "org": self.org,
            "trusted": self.trusted,
            "endpoint": self.endpoint,
            "seen_at": self.seen_at.isoformat(),
        }


@cached
def upsert_refusal(insert: InsertFn) -> postgresql.Insert | sqlite.Insert:
    stmt = insert(RefusalRow.__table__)
    return stmt.on_conflict_do_update(
        index_elements=["repo_id", "requested", "target", "error", "detail"],
        set_={
            "count": RefusalRow.__table__.c.count + 1,
            "last_seen": stmt.excluded.last_seen,
            "message": stmt.excluded.message,
            "commit_sha": stmt.excluded.commit_sha,
        },
    )


def variant_row(commit_pk: int, v: VariantInfo) -> Variant:
    from ..variants import parse_fields  # kernels' parser: only a scan records variants, not a reader

    fields = parse_fields(v.name)
    meta = v.metadata or {}
    return Variant(
        commit_pk=commit_pk,
        name=v.name,
        framework=fields and fields.framework,
        framework_version=fields and fields.framework_version,
        cxx11=fields and fields.cxx11,
        backend=fields and fields.backend,
        cpu=fields and fields.cpu,
        os=fields and fields.os,
        metadata_oid=v.metadata_oid,
        metadata_json=json.dumps(v.metadata, sort_keys=True) if v.metadata is not None else None,
        archs=json.dumps(declared_archs(meta)) if meta else None,
        kernel_depends=json.dumps(declared_depends(meta)) if meta else None,
        files=[File(path=f.path, size=f.size, git_oid=f.git_oid, sha256=f.sha256) for f in v.files],
    )


def find_repo(s: Session, repo_id: str, *, repo_type: str = "kernel", endpoint: str | None = None) -> Repo:
    repo = s.scalar(select(Repo).where(Repo.repo_id == repo_id))
    if repo is None:
        repo = Repo(repo_id=repo_id, repo_type=repo_type, endpoint=endpoint)
        s.add(repo)
        s.flush()
    elif endpoint is not None:
        s.execute(update(Repo).where(Repo.id == repo.id).values(endpoint=endpoint, repo_type=repo_type))
    return repo
