"""serve's bearer tokens."""

from __future__ import annotations

import click

from frt.mirror.home_path import check_writable

from .app import App, cli, emit_json, json_option
from .render import table


@cli.group("token")
def token_group() -> None:
    """Bearer tokens for serve: with any token, requests without a valid one get 401."""


@token_group.command("add")
@click.argument("name")
@click.pass_obj
def token_add(app: App, name: str) -> None:
    """Create a token and print it (the only time it is shown; the ledger keeps its hash)."""
    from frt.mirror.serve.tokens import add_token

    check_writable(app.root, "token add writes the ledger")
    click.echo(add_token(app.ledger, name))


@token_group.command("list")
@json_option
@click.pass_obj
def token_list(app: App, as_json: bool) -> None:
    from frt.mirror.serve.tokens import list_tokens

    rows = list_tokens(app.existing_home.ledger)
    if as_json:
        emit_json([{"name": n, "created_at": c} for n, c in rows])
    else:
        click.echo(table(["name", "created"], rows) if rows else "no tokens: serve is open to every client")


@token_group.command("revoke")
@click.argument("name")
@click.pass_obj
def token_revoke(app: App, name: str) -> None:
    from frt.mirror.serve.tokens import revoke_token

    check_writable(app.root, "token revoke writes the ledger")
    revoke_token(app.existing_home.ledger, name)
    click.echo(f"revoked {name} (a running serve stops accepting it within 2 s)")
