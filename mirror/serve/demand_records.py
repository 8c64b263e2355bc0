"""The fleet's demand: what serve's kernels clients asked for, by target, and what it could not answer.

serve counts (mirror/serve/demand.py) and writes the counts here now and then, added per UTC day to one
row per repo x what was asked x target x outcome: storage grows with what the fleet asks, not with how
often. `demand_lines` reads them back per repo x target for `report --demand` and the page, each miss
marked where it has been staged since; `misses_manifest` turns the misses into a manifest that `stage`
takes on the connected box.

What was asked is a staged row's `requested` label: "v2", "revision <sha>"; "" where kernels asked for a
repo this mirror has nothing of (it names no version before the refs it could not get).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy import select

from frt.resolver.ledger import Ledger
from frt.resolver.ledger.dialect import insert_for

from ..schema import Demand
from ..store.records import StagedRow

SERVED = "served"
# What serve could not answer: a version it knows of (its refs) but has not staged, a staged version with
# no build for the client's target, a revision it never had, a repo it has nothing of.
MISSES = {
    "version": "not staged here",
    "variant": "no build staged for this target",
    "revision": "not staged here",
    "repo": "nothing of this repo is staged here",
}
OUTCOMES = (SERVED, *MISSES)
TIER = "tier "  # the client column's prefix for counts a tier below handed on (demand_rollup.py)


@dataclass(frozen=True)
class Ask:
    """One counted kind of request."""

    repo: str
    asked: str
    target: str
    outcome: str
    client: str = ""


@dataclass
class Tally:
    count: int
    first: datetime
    last: datetime
    variant: str = ""


@dataclass(frozen=True)
class Miss:
    asked: str
    outcome: str
    count: int
    last_seen: datetime
    staged_since: bool  # staged for this target (or, for a repo miss, anything of it) now

    @property
    def reason(self) -> str:
        return f"{self.asked or 'the repo'}: {MISSES[self.outcome]}"

    @property
    def text(self) -> str:
        return self.reason + (" (staged since)" if self.staged_since else "")


@dataclass(frozen=True)
class DemandLine:
    """One repo x target over the window: how many requests, when last, what was served, what missed."""

    repo: str
    target: str
    requests: int
    last_seen: datetime
    served: tuple[str, ...] = ()  # "v1 torch-cpu": what was asked and the variant it was answered with
    misses: tuple[Miss, ...] = field(default_factory=tuple)
    # Where counts a tier below handed on came from (demand_rollup.py): each row's origin chain, as the
    # client column keeps it ("cluster:port > region:port"); () where every count was this mirror's own.
    via: tuple[str, ...] = ()

    @property
    def open_misses(self) -> tuple[Miss, ...]:
        return tuple(m for m in self.misses if not m.staged_since)


def record_demand(ledger: Ledger, tallies: Mapping[Ask, Tally]) -> None:
    """Add `tallies` to the counts, in one write (each to the UTC day of its last request)."""
    if not tallies:
        return
    rows = [
        {
            "day": t.last.astimezone(UTC).date().isoformat(),
            "repo_id": a.repo,
            "asked": a.asked,
            "target": a.target,
            "outcome": a.outcome,
            "client": a.client,
            "variant": t.variant,
            "count": t.count,
            "first_seen": _naive(t.first),
            "last_seen": _naive(t.last),
        }
        for a, t in tallies.items()
    ]
    with ledger.session() as s:
        insert = insert_for(s)
        for i in range(0, len(rows), 200):
            stmt = insert(Demand).values(rows[i : i + 200])
            s.execute(
                stmt.on_conflict_do_update(
                    index_elements=["day", "repo_id", "asked", "target", "outcome", "client"],
                    set_={
                        "count": Demand.count + stmt.excluded.count,
                        "last_seen": stmt.excluded.last_seen,
                        "variant": stmt.excluded.variant,
                    },
                )
            )


def demand_lines(ledger: Ledger, staged: Iterable[StagedRow], since: timedelta | None = None) -> list[DemandLine]:
    """Per repo x target, most requested first: the counts of the days within `since` (whole UTC days:
    counts are kept per day), every day without it."""
    q = select(Demand)
    if since is not None:
        q = q.where(Demand.day >= (datetime.now(UTC) - since).date().isoformat())
    with ledger.session(write=False) as s:
        rows = list(s.scalars(q))
    have = {(r.repo, r.requested, r.target) for r in staged}
    repos = {r.repo for r in staged}
    groups: dict[tuple[str, str], list[Demand]] = {}
    for r in rows:
        groups.setdefault((r.repo_id, r.target), []).append(r)
    out = []
    for (repo, target), mine in groups.items():
        served = sorted({f"{r.asked} {r.variant}".strip() for r in mine if r.outcome == SERVED})
        missed: dict[tuple[str, str], list[Demand]] = {}
        for r in mine:
            if r.outcome in MISSES:
                missed.setdefault((r.asked, r.outcome), []).append(r)
        misses = tuple(
            Miss(
                asked,
                outcome,
                sum(r.count for r in rs),
                max(r.last_seen for r in rs),
                repo in repos if outcome == "repo" else (repo, asked, target) in have,
            )
            for (asked, outcome), rs in sorted(missed.items())
        )
        via = tuple(sorted({r.client[len(TIER) :] for r in mine if r.client.startswith(TIER)}))
        requests, last = sum(r.count for r in mine), max(r.last_seen for r in mine)
        out.append(DemandLine(repo, target, requests, last, tuple(served), misses, via))
    out.sort(key=lambda d: (-d.requests, d.repo, d.target))
    return out


def misses_manifest(lines: Iterable[DemandLine]) -> tuple[str, int]:
    """A manifest of every miss not staged since: its targets, and per repo the versions and revisions
    asked for. `stage` stages each of them for each target; where one has no build, that is a refusal on
    record, as for any manifest. A repo kernels asked for by name only (it never got as far as a version)
    is a comment to fill in. Returns the text and how many misses it holds."""
    targets: set[str] = set()
    wanted: dict[str, dict[str, dict[str, int | str]]] = {}
    unnamed: dict[str, set[str]] = {}
    for line in lines:
        for m in line.open_misses:
            if line.target:
                targets.add(line.target)
            if m.outcome == "repo":
                unnamed.setdefault(line.repo, set()).add(line.target)
            elif m.asked.startswith("v") and m.asked[1:].isdigit():
                wanted.setdefault(line.repo, {})[m.asked] = {"version": int(m.asked[1:])}
            elif m.asked.startswith("revision "):
                wanted.setdefault(line.repo, {})[m.asked] = {"revision": m.asked.split(" ", 1)[1]}
    out = ["# What the fleet asked serve for and it could not answer (frt-mirror demand manifest)."]
    out += [f"\n[[targets]]\ntarget = {json.dumps(t)}" for t in sorted(targets)]
    out.append("\n[kernels]")
    for repo, specs in sorted(wanted.items()):
        items = [", ".join(f"{k} = {json.dumps(v)}" for k, v in spec.items()) for _, spec in sorted(specs.items())]
        out.append(f"{json.dumps(repo)} = [{', '.join(f'{{ {i} }}' for i in items)}]")
    for repo, ts in sorted(unnamed.items()):
        on = ", ".join(sorted(t for t in ts if t)) or "a target its clients did not name"
        out.append(f"# {json.dumps(repo)} = {{ version = N }}  # asked for on {on}: nothing of it is staged here")
    return "\n".join(out) + "\n", sum(len(s) for s in wanted.values()) + len(unnamed)


def _naive(dt: datetime) -> datetime:
    """UTC without tzinfo, as the ledger keeps its times."""
    return dt.astimezone(UTC).replace(tzinfo=None) if dt.tzinfo is not None else dt
