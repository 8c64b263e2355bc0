"""The `frt-mirror` command: a thin shell over `frt.resolver` and `frt.mirror`.

Each command parses arguments, calls one function, renders a table or JSON.
Exit codes: 0 ok, 1 refused or failed verification, 2 bad usage or bad input, 3 the upstream (or the
ledger's database) unavailable: try again later.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import click

from frt.resolver import (
    FrtError,
    HubClient,
    KernelUnavailable,
    Ledger,
    build_matrix,
    exit_code,
    parse_target,
    resolve,
    scan,
)
from frt.resolver.errors import BadInput
from frt.resolver.gate import check_repo_id

from .home import default_home, ledger_path
from .render import human_bytes, table


@dataclass
class App:
    home: Path
    endpoint: str | None
    _ledger: Ledger | None = None

    @property
    def ledger(self) -> Ledger:
        if self._ledger is None:
            self._ledger = Ledger(ledger_path(self.home))
        return self._ledger

    def hub(self, endpoint: str | None) -> HubClient:
        return HubClient(endpoint or self.endpoint)


class _Group(click.Group):
    """Turns every FrtError into one line on stderr and the contract's exit code."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except FrtError as e:
            click.echo(f"frt-mirror: {e}", err=True)
            ctx.exit(exit_code(e))
        except OSError as e:  # a local file the user named or the home holds: unwritable, missing, full
            where = f"{e.filename}: " if e.filename else ""
            click.echo(f"frt-mirror: {where}{e.strerror or e}", err=True)
            ctx.exit(2)
        except KeyboardInterrupt:
            click.echo("frt-mirror: interrupted", err=True)
            ctx.exit(130)


def _targets(_ctx, _param, values):
    if values is None:
        return None
    if isinstance(values, str):
        return parse_target(values)
    return tuple(parse_target(v) for v in values)


def _repo_versions(_ctx, _param, values) -> dict[str, int]:
    out = {}
    for v in values or ():
        repo, sep, n = v.rpartition("=")
        if not sep or not repo or not n.isdigit():
            raise BadInput(f"--version {v!r}: expected REPO=N, e.g. --version kernels-community/activation=1")
        check_repo_id(repo)
        out[repo] = int(n)
    return out


def _emit_json(doc) -> None:
    click.echo(json.dumps(doc, indent=2, default=str))


endpoint_option = click.option("--endpoint", metavar="URL", help="Upstream Hub or mirror (default: $HF_ENDPOINT).")
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]},
             epilog="Exit codes: 0 ok; 1 refused or failed verification; 2 bad usage or input; 3 the upstream "
                    "(or the ledger's database) unavailable: try again later.")
@click.option("--home", type=click.Path(file_okay=False, path_type=Path), help="State directory "
              "(default: $FRT_MIRROR_HOME, else the platform's user data dir).")
@endpoint_option
@click.version_option(package_name="frt-mirror")
@click.pass_context
def cli(ctx: click.Context, home: Path | None, endpoint: str | None):
    """Resolve, stage, verify and serve Hugging Face Hub kernels for offline clusters."""
    # huggingface_hub logs its own retries ("Retrying in 2s") to stderr; ours report the outcome in
    # one line, so its chatter would break the one-line error contract.
    from huggingface_hub.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    ctx.obj = App(home=home or default_home(), endpoint=endpoint)
    ctx.call_on_close(lambda: ctx.obj._ledger and ctx.obj._ledger.close())


@cli.command("scan")
@click.argument("repos", nargs=-1, required=True)
@endpoint_option
@click.option("--jobs", default=8, show_default=True, type=click.IntRange(1, 64))
@json_option
@click.pass_obj
def scan_cmd(app: App, repos, endpoint, jobs, as_json):
    """Record refs, commit history and per-commit build variants of REPOS in the ledger."""
    for repo in repos:
        check_repo_id(repo)
    hub = app.hub(endpoint)
    reports = [scan(repo, hub=hub, ledger=app.ledger, jobs=jobs,
                    progress=None if as_json else lambda m: click.echo(m, err=True)) for repo in repos]
    if as_json:
        _emit_json([r.__dict__ for r in reports])
        return
    click.echo(table(["repo", "refs", "commits", "newly scanned", "variants found"],
                     [(r.repo, r.refs, r.commits, r.commits_scanned, r.variants) for r in reports]))


@cli.command("resolve")
@click.argument("repo")
@click.option("--version", "version", type=int, help="Kernel version N (branch vN).")
@click.option("--revision", help="Branch, tag or commit.")
@click.option("--target", "target", required=True, callback=_targets, help="torch2.11-cu130-x86_64-linux, or host.")
@click.option("--offline", is_flag=True, help="Answer from the ledger alone; never contact upstream.")
@endpoint_option
@json_option
@click.pass_obj
def resolve_cmd(app: App, repo, version, revision, target, offline, endpoint, as_json):
    """Resolve REPO for a target: the commit, the variant and its files. FRT_KERNEL_REV_<ID> pins it."""
    if version is not None and revision is not None:
        raise BadInput("give --version or --revision, not both")
    try:
        res = resolve(repo, target=target, ledger=app.ledger, version=version, revision=revision,
                      hub=None if offline else app.hub(endpoint), offline=offline)
    except KernelUnavailable as e:
        if as_json:
            _emit_json(e.refusal.to_json())
        click.echo(f"frt-mirror: refused: {e}", err=True)
        sys.exit(exit_code(e))
    if as_json:
        _emit_json(res.to_json())
        return
    total = sum(f.size for f in res.files)
    click.echo(f"{res.repo} {res.request.label} → {res.commit}  {res.variant}  for {res.target}")
    click.echo(table(["file", "size", "git oid", "sha256"],
                     [(f.path, human_bytes(f.size), f.git_oid[:12], (f.sha256 or "")[:12]) for f in res.files]))
    click.echo(f"{len(res.files)} files, {human_bytes(total)}")


@cli.command("matrix")
@click.argument("repo")
@click.option("--target", "targets", multiple=True, callback=_targets,
              help="Targets to show (repeatable; default: the targets the repo's variants were built for).")
@json_option
@click.pass_obj
def matrix_cmd(app: App, repo, targets, as_json):
    """Availability from the ledger: revision × variant, and which targets each revision serves."""
    check_repo_id(repo)
    with app.ledger.view() as view:
        if not view.known(repo):
            raise BadInput(f"{repo} is not in the ledger: run 'frt-mirror scan {repo}' first")
        m = build_matrix(view, repo, list(targets) or None)
    if as_json:
        _emit_json(m.to_json())
        return
    click.echo(_render_matrix(m))


def _render_matrix(m) -> str:
    headers = ["commit", "date", "title", "refs", *[str(i + 1) for i in range(len(m.variants))], *[f"T{i + 1}" for i in range(len(m.targets))]]
    rows = []
    for r in m.rows:
        cells = ["x" if v in r.variants else "." for v in m.variants]
        serves = ["ok" if r.serves[str(t)] else "-" for t in m.targets]
        title = r.title if len(r.title) <= 28 else r.title[:27] + "…"
        rows.append([r.commit[:10], r.date.date() if r.date else "", title, ",".join(r.refs), *cells, *serves])
    legend = [f"  {i + 1:>2}  {v}" for i, v in enumerate(m.variants)]
    legend += [f"  T{i + 1}  {t}" for i, t in enumerate(m.targets)]
    return f"{m.repo}\n{table(headers, rows)}\n\nvariants (x = built at that revision), targets (ok = served):\n" + "\n".join(legend)


@cli.command("stage")
@click.argument("manifest", required=False, type=click.Path(exists=True, path_type=Path))
@click.option("--target", "targets", multiple=True, callback=_targets,
              help="Stage for this target (repeatable; replaces the manifest's targets).")
@click.option("--jobs", default=8, show_default=True, type=click.IntRange(1, 64), help="Parallel downloads.")
@endpoint_option
@json_option
@click.pass_obj
def stage_cmd(app: App, manifest, targets, jobs, endpoint, as_json):
    """Fetch exactly the files the targets need, verified, into the store and views.

    MANIFEST: an frt manifest TOML, a pyproject.toml with [tool.kernels.dependencies], or a
    kernels.lock (default: the current directory's frt-manifest.toml, pyproject.toml or kernels.lock).
    """
    from .manifest_input import load_plan
    from .stage import stage

    plan = load_plan(manifest, targets)
    report = stage(plan.requests, plan.targets, home=app.home, ledger=app.ledger, hub=app.hub(endpoint),
                   jobs=jobs, publishers=plan.publishers, progress=not as_json)
    if as_json:
        _emit_json({"ok": report.ok, "downloaded_bytes": report.downloaded_bytes,
                    "needed_bytes": report.needed_bytes, "rows": [r.to_json() for r in report.rows]})
    else:
        click.echo(table(["repo", "requested", "target", "commit", "variant", "files", "bytes", "status"],
                         [(r.repo, r.requested, r.target, (r.commit or "")[:12], r.variant or "", r.files,
                           human_bytes(r.bytes), r.status) for r in report.rows]))
        click.echo(f"downloaded {human_bytes(report.downloaded_bytes)} of {human_bytes(report.needed_bytes)} needed")
        bare = sorted({f"{r.repo}@{r.commit[:12]} {r.variant}" for r in report.rows if r.publisher_digest is False})
        if bare:
            click.echo(f"note: {len(bare)} staged variant(s) carry no publisher digest in metadata.json (checked "
                       f"against the upstream's hashes only): {', '.join(bare)}")
        for r in report.rows:
            if r.status != "staged":
                click.echo(f"frt-mirror: {r.status}: {r.detail}", err=True)
    sys.exit(0 if report.ok else 1)


@cli.command("verify")
@json_option
@click.pass_obj
def verify_cmd(app: App, as_json):
    """Re-hash every blob and check every view link; exit 1 with a list on any mismatch."""
    from .verify import verify

    report = verify(app.home, app.ledger)
    if as_json:
        _emit_json(report.to_json())
    else:
        click.echo(f"{report.blobs} blobs ({human_bytes(report.bytes)}) re-hashed, {report.view_files} view files "
                   f"checked, publishers' digests checked ({report.no_digest} variant(s) have none): "
                   f"{'ok' if report.ok else f'{len(report.problems)} problem(s)'}")
        for p in report.problems:
            click.echo(f"  {p}")
    sys.exit(0 if report.ok else 1)


@cli.command("env")
@click.option("--target", "target", callback=_targets, help="The cluster's target (for LOCAL_KERNELS).")
@click.option("--serve", "serve_url", metavar="URL", help="Print the cluster side of 'frt-mirror serve' at URL instead.")
@click.option("--engine", type=click.Choice(["vllm", "sglang"]),
              help="Also the serving engine's side: the seat adapters from PYTHONPATH (writes --python-dir).")
@click.option("--seats", "seats", type=click.Path(dir_okay=False, path_type=Path),
              help="With --engine: the seat catalog the engine's workers attach (FRT_SEATS).")
@click.option("--python-dir", "python_dir", type=click.Path(file_okay=False, path_type=Path),
              help="With --engine: where to write the frt package and its plugin dist-info "
                   "[default: HOME/python].")
@click.option("--version", "versions", multiple=True, metavar="REPO=N", callback=_repo_versions,
              help="With --target: the staged version LOCAL_KERNELS points at for REPO (repeatable); "
                   "needed where several versions of a repo are staged.")
@click.option("--format", "fmt", type=click.Choice(["sh", "json"]), default="sh", show_default=True)
@click.pass_obj
def env_cmd(app: App, target, serve_url, engine, seats, python_dir, versions, fmt):
    """What a cluster sets: LOCAL_KERNELS for a target's staged set (one commit per repo: the resolved
    one, or the pin), or with --serve, HF_ENDPOINT for a running mirror. With --engine, also what a
    vLLM or SGLang job sets to attach seats in its workers without installing anything: PYTHONPATH
    (the frt package and the plugin's dist-info, written to --python-dir), FRT_MIRROR_HOME, FRT_SEATS
    and the engine's plugin allow-list."""
    from .env import TELEMETRY_WARNING, check_catalog, endpoint_vars, engine_vars, env_vars, local_kernels, render_sh

    if (seats or python_dir) and not engine:
        raise BadInput("--seats and --python-dir go with --engine vllm|sglang")
    values: dict[str, str] = {}
    entries: list = []
    warnings: list[str] = []
    if versions and (serve_url or target is None):
        raise BadInput("--version REPO=N goes with --target (it picks what LOCAL_KERNELS points at)")
    if serve_url:
        values = endpoint_vars(serve_url)
    elif target is not None:
        chosen = local_kernels(app.home.absolute(), app.ledger, target, versions=versions)
        entries, warnings = chosen.entries, chosen.warnings
        values = env_vars(entries)
    elif not engine:
        raise BadInput("give --target T (LOCAL_KERNELS), --serve URL (HF_ENDPOINT) or --engine vllm|sglang")
    if engine:
        from frt.adapters.distinfo import write_python_dir

        catalog = check_catalog(seats) if seats else None
        where = (python_dir or app.home / "python").absolute()
        values.update(engine_vars(engine, where, app.home.absolute(), catalog))  # checks before writing
        write_python_dir(where)
    if fmt == "json":
        _emit_json({"env": values, "warnings": [*warnings, TELEMETRY_WARNING], "kernels": [
            {"repo": e.repo, "requested": e.requested, "commit": e.commit, "variant": e.variant, "path": str(e.path)}
            for e in entries], **({"engine": engine, "python_dir": values["PYTHONPATH"]} if engine else {})})
        return
    for w in warnings:
        click.echo(f"frt-mirror: warning: {w}", err=True)
    for e in entries:
        click.echo(f"# {e.repo} {e.requested} → {e.commit[:12]} {e.variant}")
    click.echo(f"# warning: {TELEMETRY_WARNING}")
    if engine:
        click.echo(f"# {engine}: PYTHONPATH holds frt and its plugin; put it before any PYTHONPATH you have. "
                   "The plugin allow-list is exclusive: add your other plugins, comma-separated.")
        if not seats:
            click.echo("# set FRT_SEATS=<catalog.toml> (a seat catalog) to attach seats; unset, the plugin does nothing")
        if engine == "sglang":
            click.echo("# SGLang without sglang.srt.plugins (before 0.5.23): frt.adapters.sglang_engine.install(DIR) "
                       "writes a sitecustomize; put DIR first on PYTHONPATH and set FRT_SGLANG_ATTACH=1")
    click.echo(render_sh(values))


@cli.command("export-cache")
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--target", "target", required=True, callback=_targets, help="The cluster's target.")
@json_option
@click.pass_obj
def export_cache_cmd(app: App, out, target, as_json):
    """Write a Hub cache for a target that works with HF_HUB_OFFLINE=1 (refs/vN for every staged version)."""
    from .hfcache import export_cache

    refs = export_cache(out, app.home, app.ledger, target)
    if as_json:
        _emit_json({"cache": str(out), "refs": [{"repo": r, "ref": ref, "commit": c} for r, ref, c in refs]})
        return
    click.echo(table(["repo", "ref", "commit"], [(r, ref, c[:12]) for r, ref, c in refs]))
    click.echo(f"\nHF_HUB_CACHE={out.absolute()}  (with HF_HUB_OFFLINE=1 on the cluster)")


@cli.command("bundle")
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--target", "targets", multiple=True, callback=_targets,
              help="Only what is staged for this target (repeatable; default: everything staged).")
@json_option
@click.pass_obj
def bundle_cmd(app: App, out, targets, as_json):
    """Write OUT.tar: the staged set (blobs and ledger rows) for 'frt-mirror import' across an air gap."""
    from .bundle import bundle

    report = bundle(out, app.home, app.ledger, [str(t) for t in targets] or None)
    if as_json:
        _emit_json(report.to_json())
    else:
        click.echo(report.render())


@cli.command("import")
@click.argument("src", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@json_option
@click.pass_obj
def import_cmd(app: App, src, as_json):
    """Verify every file of IN.tar, then add it to the store, ledger and views; nothing if any check fails."""
    from .bundle import import_bundle

    report = import_bundle(src, app.home, app.ledger)
    if as_json:
        _emit_json(report.to_json())
    else:
        click.echo(report.render())


@cli.command("report")
@json_option
@click.pass_obj
def report_cmd(app: App, as_json):
    """Every refusal on record: repo, version, target, error, detail (verbatim)."""
    rows = app.ledger.refusals()
    if as_json:
        _emit_json([
            {"repo": r.repo_id, "requested": r.requested, "version": r.version, "revision": r.revision,
             "target": r.target, "commit": r.commit_sha, "error": r.error, "message": r.message, "detail": r.detail,
             "count": r.count, "first_seen": r.first_seen.isoformat(), "last_seen": r.last_seen.isoformat()}
            for r in rows
        ])
        return
    if not rows:
        click.echo("no refusals on record")
        return
    click.echo(table(["repo", "requested", "target", "error", "count", "message"],
                     [(r.repo_id, r.requested, r.target, r.error, r.count, r.message) for r in rows]))


@cli.command("pin")
@click.argument("repo")
@click.argument("revision")
@click.option("--target", "target", required=True, callback=_targets, help="The target to pin for.")
@click.option("--format", "fmt", type=click.Choice(["sh", "json"]), default="sh", show_default=True)
@endpoint_option
@click.pass_obj
def pin_cmd(app: App, repo, revision, target, fmt, endpoint):
    """The environment that loads REPO at exactly REVISION: FRT_KERNEL_REV_<ID> and LOCAL_KERNELS
    (the commit is staged first if it is not yet)."""
    from .pin import pin_env
    from .env import render_sh

    try:
        pinned = pin_env(repo, revision, target, home=app.home.absolute(), ledger=app.ledger, hub=app.hub(endpoint))
    except KernelUnavailable as e:
        click.echo(f"frt-mirror: refused: {e}", err=True)
        sys.exit(exit_code(e))
    if fmt == "json":
        _emit_json({"repo": pinned.repo, "commit": pinned.commit, "variant": pinned.variant, "env": pinned.env})
    else:
        click.echo(f"# {pinned.repo} pinned to {pinned.commit} ({pinned.variant})")
        click.echo(render_sh(pinned.env))


@cli.command("bisect", context_settings={"ignore_unknown_options": True})
@click.argument("repo")
@click.option("--good", required=True, help="A revision known good.")
@click.option("--bad", required=True, help="A later revision known bad.")
@click.option("--target", "target", required=True, callback=_targets, help="The target to bisect on.")
@click.option("--timeout", type=float, help="Seconds per run; a run that takes longer is skipped.")
@click.option("--refresh", is_flag=True, help="Scan upstream first even if the ledger knows the range.")
@click.option("--offline", is_flag=True, help="Use only the ledger and what is staged.")
@endpoint_option
@json_option
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_obj
def bisect_cmd(app: App, repo, good, bad, target, timeout, refresh, offline, endpoint, as_json, cmd):
    """Find the first bad commit of REPO between --good and --bad: each probed commit is staged and
    CMD runs with FRT_KERNEL_REV_<ID> and LOCAL_KERNELS pointing at it. CMD exit: 0 good, 125 skip,
    other bad (as git bisect run); a timeout is a skip."""
    from .bisect import bisect

    def show(step):
        if not as_json:
            code = "timeout" if step.exit_code is None else step.exit_code
            click.echo(f"  {step.commit[:12]}  {step.variant}  exit {code}  {step.seconds:.1f}s  {step.verdict}"
                       + (f"  ({step.note})" if step.note else ""), err=True)

    result = bisect(check_repo_id(repo), good=good, bad=bad, target=target, cmd=list(cmd),
                    home=app.home.absolute(), ledger=app.ledger, hub=None if offline else app.hub(endpoint),
                    timeout=timeout, refresh=refresh, on_step=show)
    if as_json:
        _emit_json(result.to_json())
    else:
        for sha, why in result.skipped:
            click.echo(f"skipped {sha[:12]}: {why}")
        if result.first_bad:
            click.echo(f"first bad commit: {result.first_bad}  {result.first_bad_date}  {result.first_bad_title}")
        else:
            click.echo("undecided (runs were skipped): first bad is one of " + ", ".join(result.undecided))
        click.echo(f"{len(result.steps)} runs over {len(result.candidates)} candidate commits")
    sys.exit(0 if result.first_bad else 1)


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
    from .serve import AccessLog, listen, make_app, open_sink, serve

    sockets = listen(host, port)  # first: a busy port is one line and exit 2, before anything is said
    try:
        sink = open_sink(access_log)
    except OSError as e:
        raise BadInput(f"cannot open the access log {access_log}: {e.strerror}") from None
    mirror = make_app(app.home, app.ledger, frozenset(trust), log=AccessLog(sink))
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
    from .tokens import add_token

    click.echo(add_token(app.ledger, name))


@token_group.command("list")
@json_option
@click.pass_obj
def token_list(app: App, as_json):
    from .tokens import list_tokens

    rows = list_tokens(app.ledger)
    if as_json:
        _emit_json([{"name": n, "created_at": c} for n, c in rows])
    else:
        click.echo(table(["name", "created"], rows) if rows else "no tokens: serve is open to every client")


@token_group.command("revoke")
@click.argument("name")
@click.pass_obj
def token_revoke(app: App, name):
    from .tokens import revoke_token

    revoke_token(app.ledger, name)
    click.echo(f"revoked {name} (a running serve stops accepting it within 2 s)")


def main() -> None:
    cli(prog_name="frt-mirror")


if __name__ == "__main__":
    main()
