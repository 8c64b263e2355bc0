"""serve and its bearer tokens."""

from __future__ import annotations

import click

from frt.mirror.home import check_writable
from frt.mirror.render import table
from frt.resolver.errors import BadInput

from .app import App, cli, emit_json, json_option


@cli.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8470, show_default=True, type=click.IntRange(1, 65535))
@click.option("--trust", "trust", multiple=True, metavar="ORG",
              help="Operator override: answer trustedKernelPublisher=true for ORG whatever the upstream said "
                   "(repeatable). Without it, serve answers exactly what the upstream said when it was scanned.")
@click.option("--access-log", "access_log", metavar="FILE|-",
              help="Where the access log goes, one line per request: FILE (appended to) or - for stdout "
                   "(default: stderr, with serve's other messages).")
@click.pass_obj
def serve_cmd(app: App, host, port, trust, access_log):
    """Serve the staged set as a read-only Hub endpoint: point HF_ENDPOINT at it.

    Exits 2 without serving when it cannot listen (the port is in use) or open the access log."""
    from frt.mirror.serve import AccessLog, listen, make_app, open_sink, serve

    sockets = listen(host, port)  # first: a busy port is one line and exit 2, before anything is said
    try:
        sink = open_sink(access_log)
    except OSError as e:
        raise BadInput(f"cannot open the access log {access_log}: {e.strerror}") from None
    mirror = make_app(app.home, frozenset(trust), log=AccessLog(sink))
    if not mirror.catalog().repos:
        click.echo(f"frt-mirror: warning: nothing is staged in {app.home}: every repo will be answered "
                   "RepoNotFound (stage first: frt-mirror stage MANIFEST)", err=True)
    for org in trust:
        click.echo(f"frt-mirror: --trust {org}: answering trustedKernelPublisher=true for {org} "
                   "(an operator override, not the upstream's word)", err=True)
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
    click.echo(f"frt-mirror: serving {app.home} on {url} (HF_ENDPOINT={url})", err=True)
    serve(mirror, sockets)


@cli.group("token")
def token_group():
    """Bearer tokens for serve: with any token, requests without a valid one get 401."""


@token_group.command("add")
@click.argument("name")
@click.pass_obj
def token_add(app: App, name):
    """Create a token and print it (the only time it is shown; the ledger keeps its hash)."""
    from frt.mirror.tokens import add_token

    check_writable(app.root, "token add writes the ledger")
    click.echo(add_token(app.ledger, name))


@token_group.command("list")
@json_option
@click.pass_obj
def token_list(app: App, as_json):
    from frt.mirror.tokens import list_tokens

    rows = list_tokens(app.ledger)
    if as_json:
        emit_json([{"name": n, "created_at": c} for n, c in rows])
    else:
        click.echo(table(["name", "created"], rows) if rows else "no tokens: serve is open to every client")


@token_group.command("revoke")
@click.argument("name")
@click.pass_obj
def token_revoke(app: App, name):
    from frt.mirror.tokens import revoke_token

    check_writable(app.root, "token revoke writes the ledger")
    revoke_token(app.ledger, name)
    click.echo(f"revoked {name} (a running serve stops accepting it within 2 s)")
