"""The operator's page: what this home holds, for which targets, what refused and why, how much disk,
and what was staged and imported last. `serve` answers it at `GET /` (every repo) and
`GET /-/repos/{org}/{name}` (one repo); `frt-mirror matrix REPO --html FILE` writes one repo's as a file.

Decisions as data, rendered at the edge: `operator_view` gathers an `OperatorView` from the ledger (the
resolver's availability matrix, the staged rows, the recorded refusals, the events log) and the
templates only render it. A refused cell carries the refusal's own text, verbatim: the refusal recorded
for that commit and target when a stage or resolve met it, else the variant trace in the `kernels`
library's wording (what `resolve` would have recorded). Templates autoescape: a repo id or a refusal's
text is data from upstream or a bundle and must never become markup.

The view is built from the ledger on each GET of the page, in a worker thread: the Hub API's hot path
never waits for it and never touches the ledger for it.
"""

from __future__ import annotations

import dataclasses
import functools
import shutil
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Protocol
from urllib.parse import quote

from sqlalchemy import func, select

from frt.resolver.errors import FrtError
from frt.resolver.matrix import Matrix, MatrixRow, build_matrix, targets_named_by
from frt.resolver.refusal_records import RefusalRecord
from frt.resolver.targets import Target, parse_target
from frt.resolver.variants import decide, parse_fields

from ..events import EventRow, last_events, pulled_by_repo
from ..schema import Blob
from ..stage.progress import human_bytes
from ..store.home import Home
from ..store.records import PULLED, StagedRow
from .demand_records import DemandLine, demand_lines
from .name_picks import NamePick, name_picks

if TYPE_CHECKING:
    import jinja2
    from markupsafe import Markup
    from starlette.requests import Request
    from starlette.responses import Response

    from frt.resolver.archs import Declared
    from frt.resolver.ledger.view import LedgerView

    from .watch import CatalogWatcher

    class Scraped(Protocol):
        """What the page asks of metrics.Metrics (not imported here: metrics imports this module)."""

        def flush(self) -> None: ...
        def exposition(self) -> bytes: ...


DEMAND_WINDOW, DEMAND_ROWS = timedelta(days=7), 12  # the page's "asked for" card: the last week, the most asked
INDEX_ROWS = 8  # on `/`, a repo's newest revisions shown; older ones only where a ref or a staged set points
# quarantine: a bad blob serve found (integrity.py); pull: a file serve --upstream fetched (shown where there is one)
EVENT_KINDS = ("stage", "import", "bundle", "gc", "quarantine", "pull", "evict")


@dataclass(frozen=True)
class Cell:
    """One revision x target: `served` (staged here, the variant chosen), `not-staged` (the revision has
    a variant the target accepts, the mirror does not hold it) or `refused` (no variant the target
    accepts; `refusal` is the text why, `source` where that text comes from)."""

    state: str
    variant: str | None = None
    refusal: str = ""
    source: str = ""
    # an arch target's: the variant kernels picks by name, which would not load there (the served one does)
    by_name: str | None = None


@dataclass(frozen=True)
class StagedSet:
    requested: str
    target: str
    commit: str
    variant: str
    files: int
    nbytes: int


@dataclass(frozen=True)
class RepoView:
    repo: str
    repo_type: str  # kernel | model
    matrix: Matrix | None  # None: a model, or a repo never scanned (only refusals on record)
    cells: dict[tuple[str, str], Cell] = field(default_factory=dict)  # (commit, target) -> Cell
    staged: tuple[StagedSet, ...] = ()
    refusals: tuple[RefusalRecord, ...] = ()  # every refusal on record for the repo, newest first
    rows: tuple[MatrixRow, ...] = ()  # the matrix rows shown
    hidden_rows: int = 0  # rows left to the repo's own page
    pulled: tuple[int, int, datetime] | None = None  # serve --upstream fetched of it: files, bytes, when last

    @property
    def staged_variants(self) -> dict[str, set[str]]:
        """commit -> the variants staged at it (for any target)."""
        out: dict[str, set[str]] = {}
        for s in self.staged:
            out.setdefault(s.commit, set()).add(s.variant)
        return out

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.staged)


@dataclass(frozen=True)
class StoreUsage:
    blobs: int
    nbytes: int
    disk_free: int | None  # of the filesystem holding the store; None where it cannot be asked
    disk_total: int | None


@dataclass(frozen=True)
class OperatorView:
    home: str
    generated: datetime
    repos: tuple[RepoView, ...]
    store: StoreUsage
    events: dict[str, EventRow]
    by_target: tuple[tuple[str, int, int], ...]  # (target, staged sets, bytes), over every repo
    name_picks: tuple[NamePick, ...] = ()  # where serve's clients would pick by name a build their GPUs refuse
    demand: tuple[DemandLine, ...] = ()  # repo x target the fleet asked for and missed, lately (demand_records.py)


def operator_view(
    home: Home, repo: str | None = None, targets: list[Target] | None = None, index: bool = False
) -> OperatorView:
    """The page's data. `repo`: that repo only; `targets`: the matrix's columns (default: the targets
    its variants were built for and every target something is staged for); `index`: cap each matrix
    at its newest revisions (plus the ones a ref or a staged set names), as `/` shows them."""
    ledger = home.ledger
    staged = home.staged()
    refusals = ledger.refusals()
    names = sorted({repo} if repo else set(ledger.repos()) | {r.repo for r in staged} | {r.repo_id for r in refusals})
    staged_targets = sorted({r.target for r in staged if not (r.is_model or r.is_pulled)})
    columns = targets or [parse_target(t) for t in staged_targets]
    with ledger.view() as view:
        sets = {r: _staged_set(view, r) for r in staged if r.repo in names}
        repos = [
            _repo_view(
                view,
                name,
                [r for r in staged if r.repo == name],
                sets,
                [r for r in refusals if r.repo_id == name],
                columns,
                bool(targets),
                index,
            )
            for name in names
        ]
    repos.sort(key=lambda r: (not r.staged, r.matrix is None, r.repo))  # what is served first
    totals: dict[str, list[int]] = {}
    for s in sets.values():
        t = totals.setdefault(s.target, [0, 0])
        t[0], t[1] = t[0] + 1, t[1] + s.nbytes
    pulled = pulled_by_repo(ledger)
    repos = [dataclasses.replace(r, pulled=pulled.get(r.repo)) for r in repos]
    picks = tuple(p for p in name_picks(home) if p.repo in names)
    asked = [d for d in demand_lines(ledger, staged, DEMAND_WINDOW) if d.misses and (repo is None or d.repo == repo)]
    return OperatorView(
        str(home),
        datetime.now(UTC),
        tuple(repos),
        store_usage(home),
        last_events(ledger),
        tuple((t, n, b) for t, (n, b) in sorted(totals.items())),
        picks,
        tuple(asked[:DEMAND_ROWS]),
    )


def store_usage(home: Home) -> StoreUsage:
    """Blobs recorded as stored and their bytes (the ledger's index of the store), and the disk under it
    where its blobs are files."""
    with home.ledger.session(write=False) as s:
        blobs, nbytes = s.execute(select(func.count(), func.coalesce(func.sum(Blob.size), 0)).select_from(Blob)).one()
    files = home.store.files
    if files is None:  # objects: a bucket has no disk to ask about (this host's is not the store's)
        return StoreUsage(blobs, int(nbytes), None, None)
    try:
        # The store's folder is made by its first blob: before that, the disk it will be made on.
        disk = shutil.disk_usage(next(p for p in (files.root, *files.root.parents) if p.exists()))
    except OSError:
        return StoreUsage(blobs, int(nbytes), None, None)
    return StoreUsage(blobs, int(nbytes), disk.free, disk.total)


def _staged_set(view: LedgerView, r: StagedRow) -> StagedSet:
    files, _ = view.variant(r.repo, r.commit, r.variant)
    return StagedSet(r.requested, r.target, r.commit, r.variant, len(files), sum(f.size for f in files))


def _repo_view(
    view: LedgerView,
    name: str,
    staged: list[StagedRow],
    sets: dict[StagedRow, StagedSet],
    refusals: list[RefusalRecord],
    columns: list[Target],
    explicit: bool,
    index: bool,
) -> RepoView:
    mine = tuple(sets[r] for r in staged)
    if staged and all(r.is_model for r in staged) or not view.known(name):
        kind = "model" if staged and all(r.is_model for r in staged) else "kernel"
        return RepoView(name, kind, None, staged=mine, refusals=tuple(refusals))
    if not explicit:  # the repo's own build targets beside the home's staged ones
        named = {str(t): t for t in targets_named_by(sorted({v for c in view.commits(name) for v in c.variants}))}
        columns = sorted({**named, **{str(t): t for t in columns}}.values(), key=str)
    m = build_matrix(view, name, columns)
    served = {(r.commit, r.target): r.variant for r in staged if not r.is_model}
    recorded = {(r.commit_sha, r.target): r for r in reversed(refusals) if r.commit_sha}  # newest wins
    cells = {}
    for row in m.rows:
        for t in m.targets:
            declared = view.declared(name, row.commit) if t.archs else None
            cells[(row.commit, str(t))] = _cell(row, t, served, recorded, declared)
    rows = m.rows
    if index:
        pointed = {s.commit for s in mine}
        rows = tuple(r for i, r in enumerate(m.rows) if i < INDEX_ROWS or r.refs or r.commit in pointed)
    return RepoView(name, "kernel", m, cells, mine, tuple(refusals), rows, len(m.rows) - len(rows))


def _cell(
    row: MatrixRow,
    t: Target,
    served: dict[tuple[str, str], str],
    recorded: dict[tuple[str, str], RefusalRecord],
    declared: dict[str, Declared] | None,
) -> Cell:
    key = (row.commit, str(t))
    chosen = row.serves.get(str(t))
    if chosen is not None:
        # a pulled-through variant's row names no target (PULLED + its name): it serves every target that chooses it
        staged = served.get(key) or served.get((row.commit, PULLED + chosen))
        by_name = row.by_name.get(str(t))
        return Cell("served", staged, by_name=by_name) if staged else Cell("not-staged", chosen, by_name=by_name)
    if (r := recorded.get(key)) is not None:
        text = r.message + (f"\n\n{r.detail}" if r.detail and r.detail != r.message else "")
        return Cell(
            "refused",
            refusal=text,
            source=f"recorded: {r.requested}, {r.error}, seen {r.count}x, last {r.last_seen:%Y-%m-%d %H:%M} UTC",
        )
    trace = "\n".join(f"{d.name}: {d.reason}" for d in decide(t, tuple(row.variants), declared))
    return Cell(
        "refused",
        refusal=trace or "this revision has no build variants",
        source="kernels' variant rules, for this revision's variants",
    )


# -- rendering --------------------------------------------------------------------------------------


def _environment() -> jinja2.Environment:
    import jinja2  # here: jinja2 and the templates load only where a page is rendered

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("frt.mirror.serve", "templates"),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["bytes"] = human_bytes
    env.filters["urlpath"] = lambda repo: quote(repo, safe="/")
    env.filters["target"] = _target_heading
    env.filters["variant"] = _variant_heading
    env.filters["archs"] = lambda archs: f"archs {', '.join(archs)}" if archs else "no archs"
    env.filters["when"] = lambda d: d.strftime("%Y-%m-%d %H:%M UTC") if d else ""
    env.filters["day"] = lambda d: d.strftime("%Y-%m-%d") if d else ""
    env.filters["hm"] = lambda d: d.strftime("%H:%M UTC") if d else ""
    return env


def _target_heading(t: Target) -> Markup:
    """`torch2.11-cu130` over `x86_64-linux`: a column as narrow as its cells (Markup.format escapes)."""
    from markupsafe import Markup

    parts = str(t.by_name).split("-")
    archs = Markup('<span class="t2">@{}</span>').format(",".join(t.archs)) if t.archs else ""
    return Markup('{}<span class="t2">{}</span>{}').format("-".join(parts[:-2]), "-".join(parts[-2:]), archs)


def _variant_heading(name: str) -> str:
    """A variant's column heading in two lines, `torch211-cxx11-cu130` and `x86_64-linux`: written
    vertically, each line is a column of text, and the heading half as tall."""
    from markupsafe import Markup

    f = parse_fields(name)
    tail = f"-{f.cpu}-{f.os}" if f and f.cpu and f.os else ""
    if not tail or not name.endswith(tail) or len(name) == len(tail):
        return name
    return Markup("{}<br>{}").format(name[: -len(tail)], tail[1:])


@functools.lru_cache(maxsize=1)
def _templates() -> jinja2.Environment:
    return _environment()


def render(view: OperatorView, *, title: str, standalone: bool = False, base: str = "") -> str:
    """The page as one HTML document (its CSS inline: no other request, no script). `standalone`: a
    file (matrix --html), with no links to the server's other pages; `base`: the server's root path."""
    return (
        _templates()
        .get_template("page.html")
        .render(view=view, title=title, standalone=standalone, base=base, kinds=_kinds(view))
    )


# -- serving ----------------------------------------------------------------------------------------


class OperatorRoutes:
    """serve's pages for people and Prometheus, routed before the Hub API: GET (or HEAD) `/` (every repo),
    `/-/repos/{org}/{name}` (one repo, every revision) and `/metrics`. `segs`: the request's path
    segments, decoded (MirrorApp.dispatch splits them)."""

    def __init__(self, home: Home, metrics: Scraped | None = None, watcher: CatalogWatcher | None = None) -> None:
        self.home, self.metrics, self.watcher = home, metrics, watcher

    async def __call__(self, request: Request, segs: list[str]) -> Response:
        response = await self.answer(request, segs)
        if request.method == "HEAD":  # the GET's headers (its Content-Length too), no body
            response.body = b""
        return response

    async def answer(self, request: Request, segs: list[str]) -> Response:
        import anyio
        from starlette.responses import HTMLResponse, PlainTextResponse, Response

        base = request.scope.get("root_path", "").rstrip("/")
        if request.method not in ("GET", "HEAD"):
            return PlainTextResponse("Method Not Allowed", 405, headers={"Allow": "GET, HEAD"})
        if segs == ["metrics"] and self.metrics is not None:
            from prometheus_client import CONTENT_TYPE_LATEST

            self.metrics.flush()  # this worker's tally first: the scrape sees every request answered before it
            body = await anyio.to_thread.run_sync(self.metrics.exposition)
            return Response(body, media_type=CONTENT_TYPE_LATEST)
        if segs and not (len(segs) == 4 and segs[:2] == ["-", "repos"]):
            return HTMLResponse(_not_found("No such page.", base), 404)
        repo = f"{segs[2]}/{segs[3]}" if segs else None
        try:
            status, html = await anyio.to_thread.run_sync(self.page, repo, base)
        except FrtError as e:  # the ledger's server down: say so, in one line, and what is still served
            return PlainTextResponse(f"frt-mirror: cannot build the page: {e}{self._outage()}", 503)
        return HTMLResponse(html, status)

    def _outage(self) -> str:
        """What serve still answers while the page cannot be built (the ledger down): its catalog."""
        w = self.watcher
        if w is None:
            return ""
        checked = datetime.fromtimestamp(w.checked_at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        return (
            f"\nThis serve process still serves the {len(w.current.repos)} repos of its catalog, as the "
            f"ledger last gave it ({checked}), unchanged until the ledger answers again."
        )

    def page(self, repo: str | None, base: str) -> tuple[int, str]:
        view = operator_view(self.home, repo, index=repo is None)
        if repo is not None and not _anything(view.repos[0]):
            return 404, _not_found(
                f"{repo} is not in this mirror's ledger (neither scanned, staged nor refused).", base
            )
        return 200, render(view, title=f"{repo} · frt-mirror" if repo else "frt-mirror", base=base)


def _kinds(view: OperatorView) -> tuple[str, ...]:
    """The event cards: a pull card only on a home that pull-through has fetched into."""
    return tuple(k for k in EVENT_KINDS if k not in ("pull", "evict") or k in view.events)


def _anything(r: RepoView) -> bool:
    return bool(r.matrix or r.staged or r.refusals or r.pulled)


def _not_found(text: str, base: str) -> str:
    from markupsafe import escape

    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>Not found · frt-mirror'
        f'</title></head><body><p>{escape(text)}</p><p><a href="{escape(base)}/">frt-mirror</a></p></body></html>'
    )
