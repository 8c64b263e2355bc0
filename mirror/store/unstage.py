"""unstage: drop a staged set (its staged rows, and the views no remaining row needs), so that gc can
reclaim its blobs.

A view is a (repo, commit, variant) tree that several staged rows can share (two targets that chose
the same variant, `v1` and `revision release/v1` at one commit): it goes only with the last row that
needs it, so `env` and `serve` keep answering every remaining row, and no link dangles. Rows go
first, in one write that bumps the change serial (serve's replicas reload and stop offering them),
then the views: a run cut short between the two leaves a view no row names, whose blobs gc keeps
until it is gone, never a row without its view.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from frt.resolver.errors import BadInput
from frt.resolver.gate import check_repo_id, ref_problem
from frt.resolver.repo_ids import did_you_mean

from .blobs import Digest
from .gc import plan
from .home import Home
from .lock import store_collector
from .records import StagedRow, delete_staged, staged_rows


@dataclass
class UnstageReport:
    rows: list[StagedRow]
    views: list[Path] = field(default_factory=list)  # variant dirs removed
    view_files: int = 0
    reclaimable: list[Digest] = field(default_factory=list)  # what gc would now remove

    @property
    def reclaimable_bytes(self) -> int:
        return sum(d.size for d in self.reclaimable)

    def to_json(self) -> dict[str, Any]:
        return {
            "rows": [dict(r.__dict__) for r in self.rows],
            "views": [str(p) for p in self.views],
            "view_files": self.view_files,
            "reclaimable_blobs": len(self.reclaimable),
            "reclaimable_bytes": self.reclaimable_bytes,
        }


def parse_spec(spec: str) -> tuple[str, str | None]:
    """REPO[@REV]: a repo id, and a version (`v1`), branch, tag, requested revision or commit (prefix)."""
    repo, sep, rev = spec.partition("@")
    check_repo_id(repo, where="unstage")
    if sep and (not rev or ref_problem(rev)):
        raise BadInput(
            f"unstage {spec!r}: expected REPO or REPO@REV (a version such as v1, a branch, a tag or a commit)"
        )
    return repo, rev or None


def unstage(
    home: Home,
    repo: str,
    rev: str | None = None,
    target: str | None = None,
    on_wait: Callable[[str], None] = lambda what: None,
) -> UnstageReport:
    """Drop every staged row of `repo` that `rev` and `target` (None: any) match; BadInput if none."""
    with store_collector(home, on_wait):  # no stager is linking the views this removes
        ledger = home.ledger
        every = staged_rows(ledger)
        rows = [r for r in every if r.repo == repo]
        chosen = [r for r in rows if (target is None or r.target == target) and (rev is None or _matches(r, rev))]
        if not chosen:
            raise BadInput(_nothing_matches(repo, rev, target, rows) + did_you_mean(repo, {r.repo for r in every}))
        delete_staged(ledger, chosen, store=home.store)
        report = UnstageReport(chosen)
        for view, files in drop_views(home, chosen):
            report.views.append(view)
            report.view_files += files
        report.reclaimable = plan(home).garbage
    return report


def drop_views(home: Home, rows: list[StagedRow]) -> list[tuple[Path, int]]:
    """Remove the views of `rows`, just unstaged, that no staged row names any more: (its dir, the files
    it held) per view removed. The caller holds the store's lock exclusively (no stager is linking them)."""
    views = home.views
    if views is None:  # an object store's home: no views to drop
        return []
    still = {(r.repo, r.commit, r.variant) for r in staged_rows(home.ledger) if not r.is_model}
    out = []
    for key in sorted({(r.repo, r.commit, r.variant) for r in rows if not r.is_model} - still):
        files = views.remove(*key)
        if files is not None:
            out.append((views.variant_dir(*key), files))
    return out


def _matches(row: StagedRow, rev: str) -> bool:
    if rev in (row.requested, row.revision):
        return True
    low = rev.lower()
    return len(low) >= 7 and all(c in "0123456789abcdef" for c in low) and row.commit.startswith(low)


def _nothing_matches(repo: str, rev: str | None, target: str | None, rows: list[StagedRow]) -> str:
    asked = f"{repo}@{rev}" if rev else repo
    where = f" for {target}" if target else ""
    if not rows:
        return f"unstage {asked}: {repo} is not staged"
    staged = ", ".join(sorted({f"{r.requested} ({r.commit[:12]}) for {r.target}" for r in rows}))
    return f"unstage {asked}: nothing staged matches it{where}; staged: {staged}"
