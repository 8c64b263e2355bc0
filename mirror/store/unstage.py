"""unstage: drop a staged set (its staged rows, and the views no remaining row needs), so that gc can
reclaim its blobs.

A view is a (repo, commit, variant) tree that several staged rows can share (two targets that chose
the same variant, `v1` and `revision release/v1` at one commit): it goes only with the last row that
needs it, so `env` and `serve` keep answering every remaining row, and no link dangles. Rows go
first, in one write that bumps the change serial (serve's replicas reload and stop offering them),
then the views: a run cut short between the two leaves a view no row names, whose blobs gc keeps
until it is gone, never a row without its view.

On a full disk (issue 49) that write has no room: SQLite needs space for its index and log, the store for
the tombstones. So space is made first, with the ledger read read-only: what gc would remove (always safe:
nothing references it); and where that is not enough, the chosen rows' own views and the blobs only they
reference, before the rows go. A run cut short there leaves rows whose views and blobs are gone, which is
what verify then says (missing view files and blobs of the rows being unstaged) and what running the same
unstage again ends.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from frt.resolver.errors import BadInput, LocalDiskError
from frt.resolver.gate import check_repo_id, ref_problem
from frt.resolver.ledger_file import ROOM_BYTES, free_bytes
from frt.resolver.repo_ids import did_you_mean

from .blobs import Digest
from .gc import free_files, plan
from .home import Home
from .lock import store_collector
from .records import StagedRow, delete_staged, staged_rows


@dataclass
class UnstageReport:
    rows: list[StagedRow]
    views: list[Path] = field(default_factory=list)  # variant dirs removed
    view_files: int = 0
    reclaimable: list[Digest] = field(default_factory=list)  # what gc would now remove
    freed: list[Digest] = field(default_factory=list)  # blobs removed first, to make room on a full disk

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
            "freed_blobs": len(self.freed),
            "freed_bytes": sum(d.size for d in self.freed),
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
    home.reads_when_full = True  # the rows are read read-only on a full disk, and written once there is room
    with store_collector(home, on_wait):  # no stager is linking the views this removes
        every = staged_rows(home.ledger)
        rows = [r for r in every if r.repo == repo]
        chosen = [r for r in rows if (target is None or r.target == target) and (rev is None or _matches(r, rev))]
        if not chosen:
            raise BadInput(_nothing_matches(repo, rev, target, rows) + did_you_mean(repo, {r.repo for r in every}))
        report = UnstageReport(chosen)
        if home.full:
            _make_room(home, chosen, report)
        for view, files in unstage_rows(home, chosen):
            report.views.append(view)
            report.view_files += files
        report.reclaimable = plan(home).garbage
    return report


def _make_room(home: Home, chosen: list[StagedRow], report: UnstageReport) -> None:
    """On a full disk, before the rows are written: gc's garbage first, then (still full) the views and blobs
    only `chosen` need. Where even those would not make room to write the ledger, LocalDiskError before
    any of them is touched."""
    p = plan(home)
    free_files(home, p)
    report.freed += p.garbage
    if home.writable_again():
        return
    own = plan(home, without=frozenset(r.key for r in chosen))
    would, free = sum(d.size for d in own.garbage), free_bytes(home.root)
    if free + would < ROOM_BYTES:
        raise LocalDiskError(
            f"cannot unstage: the disk of {home.root} is full ({_mib(free)} free), and removing what only "
            f"these rows need would free {_mib(would)}, short of the {_mib(ROOM_BYTES)} the ledger's write "
            "needs: free space on it and run this again; nothing was unstaged (a local disk error)"
        )
    for view, files in drop_views(home, chosen):
        report.views.append(view)
        report.view_files += files
    free_files(home, own)
    report.freed += own.garbage
    if not home.writable_again():  # another writer took the room meanwhile: running it again ends it
        raise LocalDiskError(
            f"cannot unstage: the disk of {home.root} is still full after removing {len(report.freed)} blob(s) "
            "nothing else needs (another writer?): free space on it and run this again (a local disk error)"
        )


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def unstage_rows(home: Home, rows: list[StagedRow]) -> list[tuple[Path, int]]:
    """Unstage `rows` (their records tombstoned, their ledger rows deleted), then drop their views: what
    drop_views returns. `unstage`, pull-through's withdrawals and the cache's evictions all end this way
    (a full disk's _make_room drops views first, to make room). The caller holds the store's lock
    exclusively."""
    delete_staged(home.ledger, rows, store=home.store)
    return drop_views(home, rows)


def drop_views(home: Home, rows: list[StagedRow]) -> list[tuple[Path, int]]:
    """Remove the views of `rows`, unstaged or being unstaged, that no other staged row names: (its dir,
    the files it held) per view removed. The caller holds the store's lock exclusively (no stager is
    linking them)."""
    views = home.views
    if views is None or not rows:  # an object store's home: no views to drop
        return []
    gone = {r.key for r in rows}
    still = {(r.repo, r.commit, r.variant) for r in staged_rows(home.ledger) if not r.is_model and r.key not in gone}
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
