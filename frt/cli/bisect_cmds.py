"""pin and bisect: one repo at one exact commit, staged on demand."""

from __future__ import annotations

import sys

import click

from frt.mirror.home import check_writable
from frt.resolver import KernelUnavailable, exit_code
from frt.resolver.gate import check_repo_id

from .app import App, cli, emit_json, endpoint_option, json_option, parse_targets


@cli.command("pin")
@click.argument("repo")
@click.argument("revision")
@click.option("--target", "target", required=True, callback=parse_targets, help="The target to pin for.")
@click.option("--format", "fmt", type=click.Choice(["sh", "json"]), default="sh", show_default=True)
@endpoint_option
@click.pass_obj
def pin_cmd(app: App, repo, revision, target, fmt, endpoint):
    """The environment that loads REPO at exactly REVISION: FRT_KERNEL_REV_<ID> and LOCAL_KERNELS
    (the commit is staged first if it is not yet)."""
    from frt.mirror.env import render_sh
    from frt.mirror.pin import pin_env

    check_writable(app.root, "pin records what upstream has and stages the commit it pins")
    try:
        pinned = pin_env(repo, revision, target, home=app.home, hub=app.hub(endpoint))
    except KernelUnavailable as e:
        click.echo(f"frt-mirror: refused: {e}", err=True)
        sys.exit(exit_code(e))
    if fmt == "json":
        emit_json({"repo": pinned.repo, "commit": pinned.commit, "variant": pinned.variant, "env": pinned.env})
    else:
        click.echo(f"# {pinned.repo} pinned to {pinned.commit} ({pinned.variant})")
        click.echo(render_sh(pinned.env))


@cli.command("bisect", context_settings={"ignore_unknown_options": True})
@click.argument("repo")
@click.option("--good", required=True, help="A revision known good.")
@click.option("--bad", required=True, help="A later revision known bad.")
@click.option("--target", "target", required=True, callback=parse_targets, help="The target to bisect on.")
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
    from frt.mirror.bisect import bisect

    if not offline:
        check_writable(app.root, "bisect stages the commits it probes (bisect --offline uses only what is staged)")

    def show(step):
        if not as_json:
            code = "timeout" if step.exit_code is None else step.exit_code
            click.echo(f"  {step.commit[:12]}  {step.variant}  exit {code}  {step.seconds:.1f}s  {step.verdict}"
                       + (f"  ({step.note})" if step.note else ""), err=True)

    result = bisect(check_repo_id(repo), good=good, bad=bad, target=target, cmd=list(cmd),
                    home=app.home, hub=None if offline else app.hub(endpoint),
                    timeout=timeout, refresh=refresh, on_step=show)
    if as_json:
        emit_json(result.to_json())
    else:
        for sha, why in result.skipped:
            click.echo(f"skipped {sha[:12]}: {why}")
        if result.first_bad:
            click.echo(f"first bad commit: {result.first_bad}  {result.first_bad_date}  {result.first_bad_title}")
        else:
            click.echo("undecided (runs were skipped): first bad is one of " + ", ".join(result.undecided))
        click.echo(f"{len(result.steps)} runs over {len(result.candidates)} candidate commits")
    sys.exit(0 if result.first_bad else 1)
