"""Commands that shrink the home: unstage (drop a staged set) and gc (reclaim what nothing references)."""

from __future__ import annotations

import click

from frt.mirror.home_path import check_writable
from frt.resolver.targets import parse_target

from .app import App, cli, emit_json, json_option
from .render import render_gc, render_unstage
from .say import say


def _note(what: str) -> None:
    say(what)


@cli.command("gc")
@click.option("--dry-run", is_flag=True, help="Report what would be removed; remove nothing.")
@json_option
@click.pass_obj
def gc_cmd(app: App, dry_run: bool, as_json: bool) -> None:
    """Remove blobs no staged row and no view references, and partial downloads of dead runs.

    Waits for a stage or import running in this home (and they wait for it)."""
    from frt.mirror.store.gc import collect

    home = app.existing_home  # rather than create an empty home only to find nothing in it
    check_writable(app.root, "gc removes blobs and their ledger rows (--dry-run as well: it takes the store's lock)")
    app.ride_out()
    report = collect(home, dry_run=dry_run, on_wait=_note)
    if as_json:
        emit_json(report.to_json())
    else:
        click.echo(render_gc(report))


@cli.command("unstage")
@click.argument("spec", metavar="REPO[@REV]")
@click.option("--target", help="Only what is staged for this target (default: every target).")
@json_option
@click.pass_obj
def unstage_cmd(app: App, spec: str, target: str | None, as_json: bool) -> None:
    """Drop a staged set: its staged rows and the views no other row needs; then 'gc' reclaims its blobs.

    REV: a staged version (v1), branch, tag or commit (default: everything staged of REPO)."""
    from frt.mirror.store.unstage import parse_spec, unstage

    repo, rev = parse_spec(spec)
    target = str(parse_target(target)) if target is not None else None
    home = app.existing_home
    check_writable(app.root, "unstage writes the ledger and the views")
    app.ride_out()
    report = unstage(home, repo, rev, target, on_wait=_note)
    if as_json:
        emit_json(report.to_json())
    else:
        click.echo(render_unstage(report))
