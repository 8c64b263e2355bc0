"""nginx-conf: nginx in front of serve replicas."""

from __future__ import annotations

from pathlib import Path

import click

from frt.mirror.serve.nginx import (
    DEFAULT_ACCEL,
    DEFAULT_RUN_DIR,
    NginxSite,
    ReplicaLedger,
    check_accel_prefix,
    check_replicas_share,
    parse_address,
)
from frt.mirror.serve.nginx_s3 import S3Endpoint, store_endpoint
from frt.mirror.store.files import store_root
from frt.resolver.errors import BadInput

from .app import App, cli


@cli.command("nginx-conf")
@click.option(
    "--upstream",
    "upstreams",
    multiple=True,
    metavar="HOST:PORT",
    help="A serve replica (repeatable; default 127.0.0.1:8470).",
)
@click.option(
    "--listen",
    default="80",
    show_default=True,
    metavar="[HOST:]PORT",
    help="Where nginx takes the clients' requests: the HF_ENDPOINT the nodes use.",
)
@click.option(
    "--run-dir",
    "run_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_RUN_DIR,
    show_default=True,
    help="nginx's pid file, logs and temp files.",
)
@click.option(
    "--accel-redirect",
    "accel",
    default=DEFAULT_ACCEL,
    show_default=True,
    metavar="PREFIX",
    help="nginx's internal location over the store: the replicas' serve --accel-redirect.",
)
@click.option(
    "--head-cache",
    "head_cache",
    default=0,
    show_default=True,
    type=click.IntRange(0, 3600),
    metavar="SECONDS",
    help="Let nginx answer a HEAD of a file by commit sha (an immutable URL: what "
    "kernels and snapshot_download ask for) from a cache for SECONDS after a replica answered it; "
    "a HEAD with a token, a Range or a condition always reaches a replica. 0: every HEAD does.",
)
@click.option(
    "--head-map",
    "head_map",
    is_flag=True,
    help="Let nginx answer every HEAD of a stored file by commit sha itself, from the answers the "
    "replicas on this host write into RUN_DIR/heads/ (serve --head-map RUN_DIR) and rewrite, reloading "
    "nginx, whenever the ledger changes. A HEAD with a token, a Range or a condition, or of a file by "
    "branch, reaches a replica.",
)
@click.option(
    "--user",
    metavar="USER",
    help="The user nginx's workers run as (nginx's `user`; one that may "
    "read the home's store). Default: nginx's own (nobody, or the distribution's).",
)
@click.pass_obj
def nginx_conf(
    app: App,
    upstreams: tuple[str, ...],
    listen: str,
    run_dir: Path,
    accel: str,
    head_cache: int,
    head_map: bool,
    user: str | None,
) -> None:
    """Print an nginx.conf for nginx in front of serve replicas of this home.

    nginx proxies the API and every HEAD to the replicas and sends file bodies itself from the home's
    store (X-Accel-Redirect), skipping a dead replica. Each replica runs
    `frt-mirror --home HOME [--ledger URL] serve --port P --accel-redirect PREFIX`, on the ledger this
    command was given (--ledger, $FRT_LEDGER_URL); the file's comments list them. Replicas on other
    hosts than this one need that ledger on a database server (PostgreSQL): refused without one.
    With the blobs on an object store (--store s3://BUCKET/PREFIX), nginx fetches each body from the
    store by the presigned URL the replica gives it, never through the replica."""
    home = app.root.absolute()
    files, objects = app.home.store.files, app.home.store.objects
    store: Path | S3Endpoint
    if objects is not None:  # nginx fetches each body from the store itself
        if head_map:
            why = f"nginx answers HEADs from the blobs as files; the store is {objects.url}"
            raise BadInput(f"--head-map: {why}")
        store = store_endpoint(objects)
    elif files is not None and files.root.is_dir():  # nginx sends each body from its file
        store = files.root
    else:
        raise BadInput(
            f"no blob store at {store_root(home)}: --home must be the replicas' home, as this host mounts it"
        )
    if user is not None and not user.replace("-", "").replace("_", "").isalnum():
        raise BadInput(f"--user {user!r}: expected a user name")
    replicas = tuple(parse_address(u, "--upstream") for u in upstreams or ("127.0.0.1:8470",))
    ledger = ReplicaLedger(app.home.ledger_url)
    check_replicas_share(replicas, ledger)
    site = NginxSite(
        listen=parse_address(listen, "--listen", default_host="*"),
        upstreams=replicas,
        store=store,
        run_dir=run_dir.absolute(),
        accel=check_accel_prefix(accel),
        user=user,
        head_cache=head_cache,
        head_map=head_map,
        ledger=ledger,
        store_url=app.home.store_url,
    )
    click.echo(site.render(home), nl=False)
