"""Commands that fill or carry the home: stage, verify, export-cache, bundle, import."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from frt.mirror.home_path import check_writable
from frt.mirror.stage.progress import human_bytes
from frt.resolver.errors import FrtError

from .app import App, cli, emit_json, endpoint_option, force_option, json_option, parse_targets
from .render import render_bundle, table
from .say import say

if TYPE_CHECKING:
    from frt.mirror.stage.kernels import StageReport, StageRow
    from frt.resolver.targets import Target


@cli.command("stage")
@click.argument("manifest", required=False, type=click.Path(exists=True, path_type=Path))
@click.option(
    "--target",
    "targets",
    multiple=True,
    callback=parse_targets,
    help="Stage for this target (repeatable; replaces the manifest's targets).",
)
@click.option("--jobs", default=8, show_default=True, type=click.IntRange(1, 64), help="Parallel downloads.")
@endpoint_option
@click.option(
    "--wheel-index",
    metavar="URL",
    default=None,
    help="Where the wheels of python-depends come from: a simple index (PEP 503/691). "
    "Default: $FRT_WHEEL_INDEX, else https://pypi.org/simple/.",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress meter (drawn only when stderr is a terminal).")
@json_option
@click.pass_obj
def stage_cmd(
    app: App,
    manifest: Path | None,
    targets: tuple[Target, ...],
    jobs: int,
    endpoint: str | None,
    wheel_index: str | None,
    quiet: bool,
    as_json: bool,
) -> None:
    """Fetch exactly the files the targets need, verified, into the store and views.

    MANIFEST: an frt manifest TOML, a pyproject.toml with [tool.kernels.dependencies], or a
    kernels.lock (default: the current directory's frt-manifest.toml, pyproject.toml or kernels.lock).
    """
    from frt.mirror.stage.kernels import StageReport, stage
    from frt.mirror.stage.manifest_input import load_plan
    from frt.mirror.stage.models import stage_models
    from frt.mirror.stage.wheels import default_index
    from frt.mirror.store.lock import store_writer
    from frt.mirror.store.matrix_reads import remember_matrices

    check_writable(app.root, "stage writes the ledger, the store and the views")
    app.ride_out()
    plan = load_plan(manifest, targets)
    wheel_index = default_index(wheel_index)  # checked before any work, used only if a variant needs wheels
    report = StageReport()
    with store_writer(app.home):  # gc waits: what is stored here is referenced only at the end
        if plan.requests:
            report = stage(
                plan.requests,
                plan.targets,
                home=app.home,
                hub=app.hub(endpoint, quiet=quiet),
                jobs=jobs,
                publishers=plan.publishers,
                progress=not (quiet or as_json),
                wheel_index=wheel_index,
            )
        if plan.models:  # target-less: after the kernels, so a kernel failure is reported first
            stage_models(plan.models, home=app.home, hub=app.hub(endpoint, quiet=quiet), jobs=jobs, report=report)
    remember_matrices(app.home, {r.repo for r in report.rows})  # the first `matrix` then imports no kernels
    untrusted = _untrusted_orgs(app, report)
    if as_json:
        emit_json(
            {
                "ok": report.ok,
                "downloaded_bytes": report.downloaded_bytes,
                "needed_bytes": report.needed_bytes,
                "rows": [r.to_json() for r in report.rows],
                "untrusted_orgs": untrusted,
            }
        )
    else:
        click.echo(
            table(
                ["repo", "requested", "target", "commit", "variant", "files", "bytes", "status"],
                [
                    (
                        r.repo,
                        r.requested,
                        r.target,
                        (r.commit or "")[:12],
                        r.variant or "",
                        r.files,
                        human_bytes(r.bytes),
                        r.status,
                    )
                    for r in report.rows
                ],
            )
        )
        click.echo(f"downloaded {human_bytes(report.downloaded_bytes)} of {human_bytes(report.needed_bytes)} needed")
        wheels = sorted({w for r in report.rows for w in r.wheels})
        if wheels:
            click.echo(f"wheels for python-depends: {', '.join(wheels)}")
        # publisher_digest is set on staged rows only, which have a commit (said for the type checker)
        bare = sorted(
            {f"{r.repo}@{r.commit[:12]} {r.variant}" for r in report.rows if r.publisher_digest is False and r.commit}
        )
        if bare:
            click.echo(
                f"note: {len(bare)} staged variant(s) carry no publisher digest in metadata.json (checked "
                f"against the upstream's hashes only): {', '.join(bare)}"
            )
        for (status, detail), held in _grouped(report.rows).items():
            said = f" (for {len(held)} targets: {', '.join(held)})" if len(held) > 1 else ""
            say(f"{status}: {detail}{said}")
    for org in untrusted:
        say(
            f"note: the upstream does not call {org} a trusted kernel publisher: kernels on the cluster will "
            f"refuse its kernels unless trust_remote_code=True (or serve --trust {org})"
        )
    sys.exit(report.exit_code)


def _grouped(rows: list[StageRow]) -> dict[tuple[str, str], list[str]]:
    """The rows not staged, one entry per (status, detail) with the targets it holds for: a refusal that
    holds for six targets is one line, not six."""
    out: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        if r.status != "staged":
            out.setdefault((r.status, r.detail), []).append(r.target)
    return out


def _untrusted_orgs(app: App, report: StageReport) -> list[str]:
    """The orgs of what was staged that the upstream's overview does not call trusted kernel publishers:
    kernels refuses their kernels at load (trust_remote_code), which the cluster would learn only then."""
    orgs = {r.repo.split("/", 1)[0] for r in report.rows if r.status == "staged" and r.variant}
    if not orgs:
        return []
    known = app.ledger.publishers(orgs)
    return sorted(org for org in orgs if org in known and not known[org].trusted)


@cli.command("verify")
@json_option
@click.pass_obj
def verify_cmd(app: App, as_json: bool) -> None:
    """Re-hash every blob and check every view link; exit 1 with a list on any mismatch."""
    from frt.mirror.store.verify import verify

    report = verify(app.reading_home)
    if as_json:
        emit_json(report.to_json())
    else:
        click.echo(
            f"{report.blobs} blobs ({human_bytes(report.bytes)}) re-hashed, {report.view_files} view files "
            f"and {report.model_files} model files checked{f', {report.wheels} wheels' if report.wheels else ''}, "
            f"publishers' digests checked "
            f"({report.no_digest} variant(s) have none): "
            f"{'ok' if report.ok else f'{len(report.problems)} problem(s)'}"
        )
        for p in report.problems:
            click.echo(f"  {p}")
        if report.readonly:
            stray = (
                f" ({report.unadopted} verified blob(s) the ledger does not record stay so)" if report.unadopted else ""
            )
            why = "the home's disk is full" if report.disk_full else "the home is read-only here"
            click.echo(f"note: {why}: verify reported only and adopted nothing{stray}")
        if report.stale_records:
            click.echo(
                f"note: {report.stale_records} record(s) of unreferenced blob(s) the store no longer holds "
                "(a gc cut short before its ledger write): the next gc drops them"
            )
    sys.exit(0 if report.ok else 1)


@cli.command("export-cache")
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--target", "target", required=True, callback=parse_targets, help="The cluster's target.")
@click.option(
    "--wheels",
    "wheels_to",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the wheels of the kernels' python-depends go, a pip find-links folder "
    "[default: OUT-wheels beside OUT, only when there are any].",
)
@click.option(
    "--keep",
    is_flag=True,
    help="Only add: keep what OUT holds that the home no longer stages (default: OUT follows the home).",
)
@json_option
@click.pass_obj
def export_cache_cmd(app: App, out: Path, target: Target, wheels_to: Path | None, keep: bool, as_json: bool) -> None:
    """Write a Hub cache for a target that works with HF_HUB_OFFLINE=1 (refs/vN for every staged version),
    and a find-links folder of the wheels its kernels' python-depends need.

    Into a folder it wrote before, OUT is made to hold what the home stages for every target exported into
    it: refs, snapshots and blobs withdrawn since are removed (unless --keep)."""
    from frt.mirror.views.env import pip_line
    from frt.mirror.views.hfcache import export_cache, wheels_needed

    wheels = wheels_needed(app.reading_home, target)
    wheels_to = (wheels_to or out.with_name(f"{out.name}-wheels")) if wheels else None
    done = export_cache(out, app.home, target, wheels_to, keep=keep)
    refs = done.refs
    # wheels_to is None exactly when no wheel is needed (said for the type checker)
    install = pip_line(wheels, wheels_to.absolute()) if wheels_to is not None else None
    if as_json:
        emit_json(
            {
                "cache": str(out),
                "refs": [{"repo": r, "ref": ref, "commit": c} for r, ref, c in refs],
                "removed": [{"repo": r, "ref": ref, "commit": c} for r, ref, c in done.removed],
                "wheels": wheels,
                "find_links": str(wheels_to) if wheels_to else None,
                "pip_install": install,
            }
        )
        return
    click.echo(table(["repo", "ref", "commit"], [(r, ref, c[:12]) for r, ref, c in refs]))
    if done.removed:
        gone = ", ".join(f"{r}@{ref}" for r, ref, _ in done.removed)
        click.echo(f"removed {len(done.removed)} ref(s) the home no longer stages: {gone}")
    click.echo(f"\nHF_HUB_CACHE={out.absolute()}  (with HF_HUB_OFFLINE=1 on the cluster)")
    if install and wheels_to is not None:
        click.echo(f"python-depends: {len(wheels)} wheel(s) in {wheels_to.absolute()}; on the cluster: {install}")


quiet_option = click.option(
    "--quiet", "-q", is_flag=True, help="No progress meter (it is drawn only when stderr is a terminal)."
)


@cli.command("bundle")
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--target",
    "targets",
    multiple=True,
    callback=parse_targets,
    help="Only what is staged for this target (repeatable; default: everything staged).",
)
@click.option(
    "--since",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    metavar="PREV.tar",
    help="Incremental: only the blobs and records PREV.tar (and its bases) do not carry.",
)
@click.option(
    "--sign",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    metavar="KEY",
    help="Sign the manifest with this private key ('frt-mirror key new KEY').",
)
@force_option
@quiet_option
@json_option
@click.pass_obj
def bundle_cmd(
    app: App,
    out: Path,
    targets: tuple[Target, ...],
    since: Path | None,
    sign: Path | None,
    force: bool,
    quiet: bool,
    as_json: bool,
) -> None:
    """Write OUT.tar: the staged set (blobs and ledger rows) for 'frt-mirror import' across an air gap."""
    from frt.mirror.bundle import bundle

    report = bundle(
        out,
        app.existing_home,
        [str(t) for t in targets] or None,
        since=since,
        sign=sign,
        progress=not (quiet or as_json),
        replace=force,
    )
    if as_json:
        emit_json(report.to_json())
    else:
        click.echo(render_bundle(report))


@cli.command("import")
@click.argument("src", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--require-signature",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    metavar="KEY.pub",
    help="Refuse the bundle unless this public key signed it.",
)
@click.option(
    "--allow-rollback",
    is_flag=True,
    help="Also stage again what this home withdrew after the bundle was written (default: skipped, and named).",
)
@quiet_option
@json_option
@click.pass_obj
def import_cmd(
    app: App, src: Path, require_signature: Path | None, allow_rollback: bool, quiet: bool, as_json: bool
) -> None:
    """Verify every file of IN.tar, then add it to the store, ledger and views; nothing if any check fails.

    An incremental bundle ('bundle --since') imports only into a home that holds its base."""
    from frt.mirror.bundle import import_bundle
    from frt.mirror.store.lock import store_collector

    check_writable(app.root, "import writes the ledger, the store and the views")
    app.ride_out()
    fresh = not (app.root.exists() or app.root.is_symlink())

    def on_wait(what: str) -> None:
        if not as_json:
            say(what)

    # Exclusive, as unstage: an incremental bundle may take views away, which no stager may be linking;
    # gc waits too (what is stored here is referenced only at the end).
    try:
        with store_collector(app.home, on_wait):
            report = import_bundle(
                src,
                app.home,
                require_signature=require_signature,
                progress=not (quiet or as_json),
                allow_rollback=allow_rollback,
            )
    except FrtError:
        if fresh:  # a refused bundle leaves no empty home behind, where there was none
            app.home.close()
            shutil.rmtree(app.root, ignore_errors=True)
        raise
    if as_json:
        emit_json(report.to_json())
    else:
        click.echo(render_bundle(report))
