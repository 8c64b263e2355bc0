"""Plain-text output for people: tables, and the one-line summaries of reports the mirror returns as
data (JSON output never goes through here)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from frt.mirror.stage.progress import human_bytes

if TYPE_CHECKING:  # the reports' modules bring the ledger's libraries: not at the CLI's start-up
    from frt.mirror.bundle.format import BundleReport
    from frt.mirror.store.gc import GcReport
    from frt.mirror.store.unstage import UnstageReport


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def render_gc(r: GcReport) -> str:
    verb = "would remove" if r.dry_run else "removed"
    line = (
        f"{verb} {len(r.removed)} unreferenced blob(s) ({human_bytes(r.removed_bytes)}) and "
        f"{len(r.parts)} partial download(s) ({human_bytes(r.part_bytes)}); kept "
        f"{r.kept_blobs} referenced blob(s) ({human_bytes(r.kept_bytes)})"
    )
    if r.ledger_deferred:
        rows = len(r.removed) + r.dropped_records
        line += f"; the disk is still full, so the ledger keeps its {rows} row(s) of them until the next gc"
    elif r.dropped_records:
        line += (
            f"; {'would drop' if r.dry_run else 'dropped'} {r.dropped_records} ledger row(s) "
            "of blobs the store did not have"
        )
    return line + (" (--dry-run: nothing was removed)" if r.dry_run else "")


def render_unstage(r: UnstageReport) -> str:
    out = table(
        ["repo", "requested", "target", "commit", "variant"],
        [(x.repo, x.requested, x.target, x.commit[:12], x.variant) for x in r.rows],
    )
    freed = (
        f"the disk was full: first removed {len(r.freed)} blob(s) nothing else needs "
        f"({human_bytes(sum(d.size for d in r.freed))}); "
        if r.freed
        else ""
    )
    return out + (
        f"\n{freed}unstaged {len(r.rows)} row(s); removed {len(r.views)} view(s) ({r.view_files} "
        f"file(s)); 'frt-mirror gc' can now reclaim {len(r.reclaimable)} blob(s) "
        f"({human_bytes(r.reclaimable_bytes)})"
    )


def render_bundle(r: BundleReport) -> str:
    rows = [(x.repo, x.requested, x.target, x.commit[:12], x.variant) for x in r.staged]
    done = (
        f"wrote {r.path}"
        if r.new_blobs is None
        else f"imported {r.path}: {r.new_blobs} new blob(s), {r.new_rows} new staged row(s)"
    )
    if r.base:
        done += f" (incremental on {r.base_name or 'its base'}, id {r.base[:12]})"
    if r.unstaged:
        done += (
            f"; {'unstages' if r.new_blobs is None else 'unstaged'} {len(r.unstaged)} row(s) its base "
            f"had: {', '.join(' '.join(k) for k in r.unstaged)}"
        )
    if r.signed_by:
        done += f", signed by key {r.signed_by}"
    if r.skipped:
        names = ", ".join(f"{x.repo}@{x.requested} for {x.target}" for x in r.skipped)
        done += (
            f"; skipped {len(r.skipped)} staged row(s) withdrawn since this bundle was written ({names}): "
            "import --allow-rollback brings them back"
        )
    return (
        table(["repo", "requested", "target", "commit", "variant"], rows)
        + f"\n{done}; {r.blobs} blobs, {human_bytes(r.bytes)}; bundle id {r.id[:12]}"
    )
