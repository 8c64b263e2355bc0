"""serve."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from frt.mirror.home_path import check_writable
from frt.mirror.serve.limits import HttpLimits
from frt.mirror.serve.nginx import DEFAULT_ACCEL, check_accel_prefix
from frt.resolver.settings import MAX_SETTING

from .app import App, Finite, cli, quiet_hub_logging
from .cache_options import cache_options, capped
from .say import say

if TYPE_CHECKING:
    import tempfile
    from typing import TypedDict, Unpack

    from frt.mirror.serve.app import MirrorApp
    from frt.mirror.serve.catalog import Catalog
    from frt.mirror.serve.pull import Upstream

    class _Limits(TypedDict):
        """serve's HTTP limit options, by HttpLimits' field names (serve_cmd's `limits`)."""

        max_header_bytes: int
        header_timeout: float
        keep_alive_timeout: int
        max_connections: int


F = TypeVar("F", bound=Callable[..., Any])
LIMIT_ENV = {field: var for field, (var, *_rest) in HttpLimits.ENV.items()}


def _limit_option(flag: str, field: str, kind: click.ParamType[Any], help: str) -> Callable[[F], F]:
    """One of serve's HTTP limits: its HttpLimits field, default and environment variable (which
    --workers hands on to each worker)."""
    return click.option(
        flag,
        field,
        envvar=LIMIT_ENV[field],
        show_envvar=True,
        default=getattr(HttpLimits, field),
        show_default=True,
        type=kind,
        help=help,
    )


@cli.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8470, show_default=True, type=click.IntRange(1, 65535))
@click.option(
    "--trust",
    "trust",
    multiple=True,
    metavar="ORG",
    help="Operator override: answer trustedKernelPublisher=true for ORG whatever the upstream said "
    "(repeatable). Without it, serve answers exactly what the upstream said when it was scanned.",
)
@click.option(
    "--access-log",
    "access_log",
    metavar="FILE|-",
    help="Where the access log goes, one line per request: FILE (appended to) or - for stdout "
    "(default: stderr, with serve's other messages).",
)
@click.option(
    "--demand-log-clients",
    "demand_clients",
    is_flag=True,
    help="Keep each kernels client's address in the demand counts (report --demand); without it none "
    "is kept, only what was asked for and for which target.",
)
@click.option(
    "--workers",
    default=1,
    show_default=True,
    type=click.IntRange(1, 256),
    help="Processes answering on the one port, each with its own catalog and ledger connection "
    "(one that dies is restarted; SIGINT or SIGTERM stops them all).",
)
@click.option(
    "--accel-redirect",
    "accel_redirect",
    metavar="PREFIX",
    help="Behind nginx (frt-mirror nginx-conf): a file GET that nginx forwards is answered with its "
    "headers and X-Accel-Redirect: PREFIX/<blob>, and nginx sends the bytes from its internal "
    "location PREFIX over the store (on --store s3://…: X-Accel-Redirect: PREFIX/<the object's presigned "
    "URL>, and nginx fetches the object). Requests that did not come through that nginx get the "
    f"bytes from serve, as without it. nginx-conf's PREFIX: {DEFAULT_ACCEL}.",
)
@click.option(
    "--head-map",
    "head_map",
    metavar="RUN_DIR",
    type=click.Path(file_okay=False, path_type=Path),
    help="Behind nginx-conf --head-map's nginx, on its host: write the answers to HEADs of stored files "
    "by commit sha into RUN_DIR/heads/ (nginx-conf's --run-dir) and reload nginx whenever the ledger "
    "changes, so that nginx answers those HEADs itself.",
)
@click.option(
    "--s3-redirect",
    "s3_redirect",
    is_flag=True,
    help="On an object store (--store s3://…): a file GET is answered with a 302 to a presigned URL of its "
    "object (valid FRT_S3_REDIRECT_TTL seconds, default 600), once serve has verified the object whole, as "
    "the Hub redirects to its CDN; a HEAD is answered here. Clients must reach the store's endpoint.",
)
@click.option(
    "--upstream",
    metavar="URL",
    help="Pull-through: a request for an allowed repo, revision or file this mirror does not have is "
    "resolved against URL (a Hub, or another mirror), fetched, verified, stored and recorded as "
    "staged, then answered. Needs --allow and a writable home.",
)
@click.option(
    "--allow",
    "allow",
    multiple=True,
    metavar="ORG",
    help="With --upstream: an org whose repos may be pulled through (repeatable; '*' for any). "
    "Any other repo that is not staged is RepoNotFound.",
)
@click.option(
    "--refs-ttl",
    "refs_ttl",
    default=60.0,
    show_default=True,
    type=Finite(0, MAX_SETTING),
    help="With --upstream: seconds a repo's refs are answered before the upstream is asked again.",
)
@click.option(
    "--upstream-timeout",
    "upstream_timeout",
    default=5.0,
    show_default=True,
    type=Finite(0.1, MAX_SETTING),
    help="With --upstream: seconds to wait for a refs refresh; past that, "
    "or with the upstream down, the last known refs and everything stored are served, flagged. Keep "
    "it under the clients' own HEAD timeout (huggingface_hub's HF_HUB_ETAG_TIMEOUT: 10 s).",
)
@click.option(
    "--upstream-hold",
    "upstream_hold",
    default=120.0,
    show_default=True,
    type=Finite(0, MAX_SETTING),
    help="With --upstream: seconds an API request for a repo this mirror has nothing of yet waits for the "
    "upstream (a rate-limit window, a slow listing), so that a client's first get_kernel succeeds "
    "(huggingface_hub's API calls have no timeout); also the longest a GET waits for a file being fetched. "
    "A HEAD or GET of a repo not known yet, or of a file whose fetch waits for the upstream's rate-limit "
    "window, waits --upstream-timeout, then gets 503 with Retry-After while the upstream's answer is on "
    "its way.",
)
@cache_options
@click.option(
    "--ready-file",
    "ready_file",
    metavar="PATH",
    type=click.Path(path_type=Path),
    help="Written (one line: serve's pid and URL) once serve can answer: its catalog loaded and every worker "
    "accepting; removed when it stops. serve refuses connections until then. With NOTIFY_SOCKET set "
    "(systemd's Type=notify) it sends READY=1 as well, and STOPPING=1 when it stops.",
)
@_limit_option(
    "--max-header-bytes",
    "max_header_bytes",
    click.IntRange(1024, 16 << 20),
    "A request's line and headers larger than this are answered 431 and the connection closed.",
)
@_limit_option(
    "--header-timeout",
    "header_timeout",
    Finite(0.1, 3600),
    "Seconds a request's line and headers may take to arrive (from the connection, or from "
    "the request's first byte); past it 408 and the connection closed, or just the close.",
)
@_limit_option(
    "--keep-alive-timeout",
    "keep_alive_timeout",
    click.IntRange(1, 3600),
    "Seconds an idle connection is kept between two requests.",
)
@_limit_option(
    "--max-connections",
    "max_connections",
    click.IntRange(1, 1 << 20),
    "Open connections per process (per worker); a request past them is answered 503. serve "
    "raises its own open-file limit to fit them, up to the hard limit (ulimit -Hn).",
)
@click.pass_obj
def serve_cmd(
    app: App,
    host: str,
    port: int,
    trust: tuple[str, ...],
    access_log: str | None,
    demand_clients: bool,
    workers: int,
    accel_redirect: str | None,
    head_map: Path | None,
    s3_redirect: bool,
    upstream: str | None,
    allow: tuple[str, ...],
    refs_ttl: float,
    upstream_timeout: float,
    upstream_hold: float,
    cache_max: str | None,
    min_free: str | None,
    ready_file: Path | None,
    **limits: Unpack[_Limits],
) -> None:
    """Serve the staged set as a read-only Hub endpoint: point HF_ENDPOINT at it.

    Exits 2 without serving when it cannot listen (the port is in use) or open the access log."""
    from frt.mirror.home_path import check_existing_home
    from frt.mirror.serve.demand_rollup import self_origin
    from frt.mirror.serve.listen import bind
    from frt.mirror.serve.ready import Readiness
    from frt.mirror.serve.run import serve
    from frt.mirror.serve.watch import CatalogWatcher
    from frt.mirror.serve.workers import AppSpec, serve_workers

    url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
    told = Readiness(ready_file, url)
    told.check()  # first: a stale ready file goes even where serve then refuses to start
    accel = check_accel_prefix(accel_redirect) if accel_redirect is not None else None
    objects = app.home.store.objects  # the blobs as objects, which clients may be redirected to
    if s3_redirect and objects is None:
        from frt.resolver.errors import BadInput

        raise BadInput("--s3-redirect only means something with --store s3://BUCKET/PREFIX")
    if objects is not None and head_map:
        from frt.resolver.errors import BadInput

        why = "--head-map needs the blobs as files"
        raise BadInput(f"--store {objects.url}: {why}")
    pull = _upstream(app, upstream, allow, refs_ttl, upstream_timeout, upstream_hold)
    if cache_max is not None or min_free is not None:  # pull-through's cache bounded (cache_cap.py)
        pull = capped(pull, cache_max, min_free, objects.url if objects is not None else None)
    if pull is None:  # serve alone only reads the home: a mistyped --home is refused, not created
        check_existing_home(app.root.absolute(), app.home.ledger_url)
    sockets = bind(host, port)  # first: a busy port is one line and exit 2, before anything is said
    if workers > 1:  # before any app is built: the workers' metrics are summed from files (metrics.py)
        metrics_dir = multiprocess_metrics()
    spec = AppSpec(
        app.home.root,
        frozenset(trust),
        access_log,
        accel,
        ledger_url=app.home.ledger_url,
        upstream=pull,
        demand_clients=demand_clients,
        head_map=head_map.absolute() if head_map is not None else None,
        store_url=app.home.store_url,
        s3_redirect=s3_redirect,
        origin=self_origin(port),
    )
    mirror = spec.build(app.home)  # here, once: a bad access log or ledger is one line before serving
    # Not mirror.catalog(): its first call starts the catalog's poller thread, which a fork must not copy.
    watcher = mirror.catalog
    assert isinstance(watcher, CatalogWatcher)  # make_app's (run.py)
    if pull is not None:
        click.echo(
            f"frt-mirror: pulling through from {pull.endpoint} for {', '.join(sorted(pull.allow))} "
            f"(refs kept {refs_ttl:g} s{f'; cache: {pull.cache.describe()}' if pull.cache else ''})",
            err=True,
        )
    elif watcher.ledger_up and not app.home.staged():  # down: it serves a snapshot, and said so
        click.echo(
            f"frt-mirror: warning: nothing is staged in {app.home}: every repo will be answered "
            "RepoNotFound (stage first: frt-mirror stage MANIFEST)",
            err=True,
        )
    for org in trust:
        click.echo(
            f"frt-mirror: --trust {org}: answering trustedKernelPublisher=true for {org} "
            "(an operator override, not the upstream's word)",
            err=True,
        )
    if watcher.ledger_up:
        _warn_name_picks(app)
    _warn_unheld(app, mirror)
    http_limits = HttpLimits(**limits)
    how = f", {workers} workers" if workers > 1 else ""
    how += f", file bodies by nginx through {accel}" if accel else ""
    click.echo(f"frt-mirror: serving {app.home} on {url}{how} (HF_ENDPOINT={url})", err=True)

    def ready() -> None:
        told.ready(f"serving {len(watcher.current.repos)} repos on {url}{how}")

    if workers == 1:
        try:
            stopped = serve(mirror, sockets, http_limits, ready, told.stopping)
        finally:  # where no signal did: the ready file goes, STOPPING=1
            told.stopping()
        _stopped(stopped.line(), 0)
    os.environ.update(http_limits.environ())  # what each forked worker's serve() reads (limits.py)
    assert mirror.log is not None  # AppSpec.build gives every app its access log
    mirror.log.sink.close()  # each worker builds its own app: its own sink, its own ledger connection
    app.home.close()
    try:
        code, by = serve_workers(spec, sockets, workers, watcher.current, ready, told.stopping)
    finally:
        told.stopping()
        metrics_dir.cleanup()
    on = f" on {by}" if by else ""
    _stopped(f"stopped{on}: each of the {workers} workers finished its requests in flight, accepted none after", code)


def _stopped(line: str, code: int) -> NoReturn:
    """serve's last line, then the end at once: everything was closed, and tearing the interpreter down
    took a second or more of a stop (a supervisor's restart, a rolling deploy) for nothing."""
    say(f"serve {line}")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _warn_unheld(app: App, mirror: MirrorApp) -> None:
    """Blobs the staged rows need that the store does not hold: their files are answered 404 (not staged),
    which is true of what this serve can send but not of what was staged; say it once, at start."""
    catalog: Catalog | None = getattr(mirror.catalog, "current", None)  # not mirror.catalog(): that starts its poller
    if catalog is None:
        return
    missing, needed = catalog.unheld
    if not missing:
        return
    store = app.home.store
    hint = " (is --store the stagers' bucket and prefix?)" if missing == needed and store.objects is not None else ""
    click.echo(
        f"frt-mirror: warning: the store {store.where} holds {needed - missing} of the {needed} blobs the staged "
        f"rows need: their files are not served{hint}; 'frt-mirror verify' names them",
        err=True,
    )


def _warn_name_picks(app: App) -> None:
    """Where a client picking by name would get a build its GPUs refuse (mirror/serve/name_picks.py)."""
    from frt.mirror.serve.name_picks import name_picks
    from frt.resolver.errors import FrtError

    try:
        picks = name_picks(app.home)
    except FrtError:  # the ledger down: serve still serves its catalog, and says so elsewhere
        return
    for pick in picks:
        click.echo(f"frt-mirror: warning: {pick.text}", err=True)


def _upstream(
    app: App, url: str | None, allow: tuple[str, ...], refs_ttl: float, timeout: float, hold: float
) -> Upstream | None:
    from frt.mirror.serve.pull import Upstream
    from frt.resolver.errors import BadInput

    if url is None:
        if allow:
            raise BadInput("--allow only means something with --upstream URL")
        return None
    if not allow:
        raise BadInput("--upstream needs --allow ORG (repeatable, or '*'): which repos this mirror may pull through")
    check_writable(app.root, "serve --upstream stores what it pulls")
    from frt.resolver.hub import resolve_endpoint

    quiet_hub_logging()
    return Upstream(resolve_endpoint(url, "--upstream"), frozenset(allow), refs_ttl, timeout, hold)


def multiprocess_metrics() -> tempfile.TemporaryDirectory[str]:
    """A private folder for prometheus_client's multiprocess mode, named in its environment variable
    (inherited by the forked workers); a fresh one per serve, so no earlier run's counts are summed in."""
    import os
    import tempfile

    from frt.mirror.serve.metrics import MULTIPROC_ENV

    folder = tempfile.TemporaryDirectory(prefix="frt-metrics-")
    os.environ[MULTIPROC_ENV] = folder.name
    return folder
