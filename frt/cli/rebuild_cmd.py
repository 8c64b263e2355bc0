"""ledger rebuild: the ledger again from the records the store holds (frt.mirror.bundle.rebuild)."""

from __future__ import annotations

from pathlib import Path

import click

from frt.mirror.home_path import check_writable, ledger_path

from .app import App, cli, emit_json, json_option
from .say import say

PROGRESS_EVERY = 500  # records read between progress lines on stderr (a few hundred read in about a second)


@cli.group("ledger")
def ledger_group() -> None:
    """The ledger itself: rebuild it from the store."""


@ledger_group.command("rebuild")
@click.option("--force", is_flag=True, help="Rebuild over a ledger that is not empty, keeping nothing of it.")
@json_option
@click.pass_obj
def ledger_rebuild(app: App, force: bool, as_json: bool) -> None:
    """Make the ledger again from the records the store holds beside the blobs, offline.

    For a ledger lost or emptied (a deleted or 0-byte ledger.sqlite, a PostgreSQL database made again)
    beside a store that still holds what was staged. Every record and the presence and size of every blob
    it names are checked before anything is written (hashing the blobs is verify's work); then the ledger is
    written in one transaction. Serve's tokens, the refusals, the events and the demand counts are not in
    the store and are not rebuilt."""
    from frt.mirror.bundle.rebuild import rebuild
    from frt.mirror.store.home import Home

    check_writable(app.root, "ledger rebuild writes the ledger")
    app.ride_out()
    home = app._home = Home(app.root.absolute(), ledger_url=app.ledger_url, store_url=app.store_url, rebuilding=True)
    if not home.ledger_url:
        _drop_empty_file(ledger_path(home.root))

    def progress(done: int, total: int) -> None:
        if total > PROGRESS_EVERY and (done % PROGRESS_EVERY == 0 or done == total):
            say(f"read {done} of {total} records")

    report = rebuild(home, force=force, on_progress=progress)
    if as_json:
        emit_json(report.to_json())
    else:
        click.echo(report.line())


def _drop_empty_file(path: Path) -> None:
    """A 0-byte SQLite ledger holds nothing: removed, so the rebuild writes a new one in its place (the
    home's check refuses it, rightly, everywhere else; check_not_forgotten here too)."""
    from frt.mirror.store.home import no_ledger_file

    if path.exists() and no_ledger_file(path):
        for extra in (path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm"), path):
            extra.unlink(missing_ok=True)
