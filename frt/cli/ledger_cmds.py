"""Commands over the ledger: scan, resolve, matrix, report."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from frt.manifests.fields import MAX_INT
from frt.mirror.home_path import check_writable
from frt.mirror.stage.progress import human_bytes
from frt.resolver.errors import BadInput, exit_code
from frt.resolver.gate import check_repo_id
from frt.resolver.resolution import KernelUnavailable

from .app import App, cli, emit_json, endpoint_option, force_option, json_option, parse_targets
from .demand_cmds import report_demand, since_option
from .render import table
from .say import say

if TYPE_CHECKING:
    from datetime import timedelta

    from frt.resolver.matrix import Matrix
    from frt.resolver.targets import Target


@cli.command("scan")
@click.argument("repos", nargs=-1, required=True)
@endpoint_option
@click.option("--jobs", default=8, show_default=True, type=click.IntRange(1, 64))
@json_option
@click.pass_obj
def scan_cmd(app: App, repos: tuple[str, ...], endpoint: str | None, jobs: int, as_json: bool) -> None:
    """Record refs, commit history and per-commit build variants of REPOS in the ledger."""
    from frt.mirror.store.matrix_reads import remember_matrices
    from frt.resolver.hub import RepoNotFound
    from frt.resolver.repo_ids import did_you_mean
    from frt.resolver.scan import scan

    for repo in repos:
        check_repo_id(repo)
    check_writable(app.root, "scan records what upstream has in the ledger")
    app.ride_out()
    hub = app.hub(endpoint)
    progress = None if as_json else lambda m: click.echo(m, err=True)
    reports = []
    for repo in repos:
        try:
            reports.append(scan(repo, hub=hub, ledger=app.ledger, jobs=jobs, progress=progress))
        except RepoNotFound as e:  # a typo of a repo scanned before is named, not left to be guessed
            raise RepoNotFound(f"{e}{did_you_mean(repo, app.ledger.repos())}") from None
    remember_matrices(app.home, repos)
    if as_json:
        emit_json([r.__dict__ for r in reports])
        return
    click.echo(
        table(
            ["repo", "refs", "commits", "newly scanned", "variants found"],
            [(r.repo, r.refs, r.commits, r.commits_scanned, r.variants) for r in reports],
        )
    )


@cli.command("resolve")
@click.argument("repo")
@click.option("--version", "version", type=click.IntRange(0, MAX_INT), help="Kernel version N (branch vN).")
@click.option("--revision", help="Branch, tag or commit.")
@click.option(
    "--target", "target", required=True, callback=parse_targets, help="torch2.11-cu130-x86_64-linux, or host."
)
@click.option("--offline", is_flag=True, help="Answer from the ledger alone; never contact upstream.")
@endpoint_option
@json_option
@click.pass_obj
def resolve_cmd(
    app: App,
    repo: str,
    version: int | None,
    revision: str | None,
    target: Target,
    offline: bool,
    endpoint: str | None,
    as_json: bool,
) -> None:
    """Resolve REPO for a target: the commit, the variant and its files. FRT_KERNEL_REV_<ID> pins it."""
    from frt.resolver.resolve import resolve

    if version is not None and revision is not None:
        raise BadInput("give --version or --revision, not both")
    if not offline:
        check_writable(
            app.root,
            "resolve without --offline records what upstream has in the ledger "
            "(resolve --offline reads the ledger alone)",
        )
    try:
        res = resolve(
            repo,
            target=target,
            ledger=(app.existing_home if offline else app.home).ledger,
            version=version,
            revision=revision,
            hub=None if offline else app.hub(endpoint),
            offline=offline,
        )
    except KernelUnavailable as e:
        if as_json:
            emit_json(e.refusal.to_json())
        say(f"refused: {e}")
        sys.exit(exit_code(e))
    if as_json:
        emit_json(res.to_json())
        return
    total = sum(f.size for f in res.files)
    archs = ""
    if res.target.archs:  # what the chosen build declares: it covers every arch the target names
        from frt.resolver.archs import Declared

        archs = f" ({Declared.of(res.metadata).label})"
    click.echo(f"{res.repo} {res.request.label} → {res.commit}  {res.variant}{archs}  for {res.target}")
    click.echo(
        table(
            ["file", "size", "git oid", "sha256"],
            [(f.path, human_bytes(f.size), f.git_oid[:12], (f.sha256 or "")[:12]) for f in res.files],
        )
    )
    click.echo(f"{len(res.files)} files, {human_bytes(total)}")


@cli.command("matrix")
@click.argument("repo")
@click.option(
    "--target",
    "targets",
    multiple=True,
    callback=parse_targets,
    help="Targets to show (repeatable; default: the targets the repo's variants were built for and those it "
    "is staged for).",
)
@click.option(
    "--html",
    "html",
    metavar="FILE",
    help="Write the matrix as one self-contained HTML page (the page serve shows at /-/repos/REPO): "
    "cells coloured served / not staged / refused, each refusal's text in full.",
)
@force_option
@json_option
@click.pass_obj
def matrix_cmd(app: App, repo: str, targets: tuple[Target, ...], html: str | None, force: bool, as_json: bool) -> None:
    """Availability from the ledger: revision × variant, and which targets each revision serves."""
    check_repo_id(repo)
    from frt.mirror.store.matrix_reads import quick_matrix
    from frt.resolver.decisions_memo import memo

    # One sqlite3 read where it can answer; kernels' answers it asks for and did not find kept are kept.
    m = quick_matrix(app.reading_home, repo, list(targets) or None) if html is None else None
    if m is None:
        m = _matrix_from_ledger(app, repo, targets, html, force, as_json)
    memo().save()
    if m is None:
        return
    if as_json:
        emit_json(m.to_json())
        return
    click.echo(_render_matrix(m))


def _matrix_from_ledger(
    app: App, repo: str, targets: tuple[Target, ...], html: str | None, force: bool, as_json: bool
) -> Matrix | None:
    """The matrix through the ledger's own path; None where it was answered already (a model repo, and
    --html without --json)."""
    from frt.mirror.store.matrix_reads import staged_columns
    from frt.mirror.store.records import MODEL_TARGET, repo_types
    from frt.resolver.matrix import build_matrix

    models = [r for r in app.reading_home.staged(MODEL_TARGET) if r.repo == repo]
    if html is not None:
        _write_html(app, repo, list(targets) or None, html, known=bool(models), replace=force, as_json=as_json)
        if not as_json:
            return None
    if models:  # a model has files, not variants: nothing to tabulate by target
        if as_json:
            kind = repo_types(app.ledger, models)[models[0]]
            emit_json(
                {
                    "repo": repo,
                    "repo_type": kind,
                    "targets": [],
                    "staged": [{"requested": r.requested, "commit": r.commit} for r in models],
                }
            )
        else:
            staged = ", ".join(f"{r.requested} at {r.commit[:12]}" for r in models)
            kind = repo_types(app.ledger, models)[models[0]]
            click.echo(f"{repo}: a {kind} repo: {kind}s have no targets (staged: {staged})")
        return None
    with app.ledger.view() as view:
        if not view.known(repo):
            raise _not_in_ledger(app, repo)
        also = staged_columns(r.target for r in app.home.staged() if r.repo == repo)
        return build_matrix(view, repo, list(targets) or None, also=also)


def _not_in_ledger(app: App, repo: str) -> BadInput:
    """A repo matrix cannot show: the scanned one it is a typo of, if any, else how to scan it."""
    from frt.resolver.repo_ids import did_you_mean

    if near := did_you_mean(repo, app.ledger.repos()):
        return BadInput(f"{repo} is not in the ledger{near}")
    return BadInput(f"{repo} is not in the ledger: run 'frt-mirror scan {repo}' first, if that is its name")


def _write_html(
    app: App, repo: str, targets: list[Target] | None, path: str, known: bool, replace: bool, as_json: bool
) -> None:
    from pathlib import Path

    from frt.mirror.serve.page import operator_view, render
    from frt.resolver.fs import atomic_write

    if not known:
        with app.ledger.view() as view:
            if not view.known(repo):
                raise _not_in_ledger(app, repo)
    exists = BadInput(f"{path} exists: matrix --html does not replace it; --force does")
    if not replace and (Path(path).exists() or Path(path).is_symlink()):
        raise exists
    page = render(operator_view(app.home, repo, targets), title=f"{repo} · frt-mirror matrix", standalone=True)
    try:
        atomic_write(Path(path), page, exclusive=not replace)
    except FileExistsError:  # another writer's landed meanwhile: theirs stays
        raise exists from None
    except OSError as e:
        raise BadInput(f"cannot write {path}: {e.strerror or e}") from None
    # The result, on stdout, unless stdout is --json's: then this is a note beside it, on stderr.
    click.echo(f"wrote the matrix of {repo} to {path} ({human_bytes(len(page.encode()))})", err=as_json)


def _render_matrix(m: Matrix) -> str:
    headers = [
        "commit",
        "date",
        "title",
        "refs",
        *[str(i + 1) for i in range(len(m.variants))],
        *[f"T{i + 1}" for i in range(len(m.targets))],
    ]
    rows: list[list[object]] = []
    for r in m.rows:
        cells = [("n" if v in r.no_digest else "x") if v in r.variants else "." for v in m.variants]
        serves = [("fb" if r.fallback(str(t)) else "ok") if r.serves[str(t)] else "-" for t in m.targets]
        title = r.title if len(r.title) <= 28 else r.title[:27] + "…"
        rows.append([r.commit[:10], r.date.date() if r.date else "", title, ",".join(r.refs), *cells, *serves])
    legend = [f"  {i + 1:>2}  {v}{_declared_archs(m, v)}" for i, v in enumerate(m.variants)]
    legend += [f"  T{i + 1}  {t}" for i, t in enumerate(m.targets)]
    key = (
        "variants (x = built at that revision, n = built, with no publisher digest, . = not built), "
        "targets (ok = served, - = not served: resolve --target says why"
    )
    if any(r.by_name for r in m.rows):
        key += (
            ", fb = served by a build that loads on every arch of the target, not by the one kernels picks "
            "by name there, which would raise: env and export-cache hand out the fb build"
        )
    return f"{m.repo}\n{table(headers, rows)}\n\n{key}):\n" + "\n".join(legend)


def _declared_archs(m: Matrix, variant: str) -> str:
    """What a variant's builds declare, newest revision first where it changed: `  archs 9.0`."""
    seen = list(dict.fromkeys(r.archs.get(variant) for r in m.rows if variant in r.variants))
    if not seen:
        return ""
    text = " | ".join(f"archs {', '.join(a)}" if a else "no archs" for a in seen)
    return f"  {text}" + ("  (by revision, newest first)" if len(seen) > 1 else "")


@cli.command("report")
@click.option("--demand", is_flag=True, help="What serve's kernels clients asked for, and what it could not answer.")
@since_option
@json_option
@click.pass_obj
def report_cmd(app: App, demand: bool, since: timedelta | None, as_json: bool) -> None:
    """Every refusal on record: repo, version, target, error, detail (verbatim). With --demand: per repo
    and target, what the fleet asked serve for, when last, what it was served and what it missed."""
    if demand:
        return report_demand(app, since, as_json)
    if since is not None:
        raise BadInput("--since goes with --demand: the refusals on record are listed whole")
    rows = app.reading_home.refusals()
    if as_json:
        emit_json(
            [
                {
                    "repo": r.repo_id,
                    "requested": r.requested,
                    "version": r.version,
                    "revision": r.revision,
                    "target": r.target,
                    "target_archs": _target_archs(r.target),
                    "commit": r.commit_sha,
                    "error": r.error,
                    "message": r.message,
                    "detail": r.detail,
                    "count": r.count,
                    "first_seen": r.first_seen.isoformat(),
                    "last_seen": r.last_seen.isoformat(),
                }
                for r in rows
            ]
        )
        return
    if not rows:
        click.echo("no refusals on record")
        return
    click.echo(
        table(
            ["repo", "requested", "target", "error", "count", "message"],
            [(r.repo_id, r.requested, r.target, r.error, r.count, r.message) for r in rows],
        )
    )


def _target_archs(target: str) -> list[str]:
    """The GPU archs a recorded target string names after '@' (canonical: it was str(Target))."""
    _, at, archs = target.partition("@")
    return archs.split(",") if at else []
