"""pin and bisect: one repo at one exact commit, staged on demand."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, NoReturn

import click

from frt.mirror.home_path import check_writable
from frt.resolver.errors import BadInput, exit_code
from frt.resolver.gate import check_repo_id
from frt.resolver.resolution import KernelUnavailable
from frt.resolver.settings import MAX_SETTING

from .app import App, Finite, cli, emit_json, endpoint_option, json_option, parse_targets
from .render import table
from .say import say

if TYPE_CHECKING:
    from typing import TypedDict

    from frt.mirror.bisect.by_metric import Metric, PerfResult, PerfStep
    from frt.mirror.bisect.by_revision import Step
    from frt.mirror.store.home import Home
    from frt.resolver.hub import HubClient
    from frt.resolver.targets import Target

    class _Common(TypedDict):
        """What both bisects take besides the repo (bisect_cmd's `common`)."""

        good: str
        bad: str
        target: Target
        cmd: list[str]
        home: Home
        hub: HubClient | None
        timeout: float | None
        refresh: bool


@cli.command("pin")
@click.argument("repo")
@click.argument("revision")
@click.option("--target", "target", required=True, callback=parse_targets, help="The target to pin for.")
@click.option("--format", "fmt", type=click.Choice(["sh", "json"]), default="sh", show_default=True)
@endpoint_option
@click.pass_obj
def pin_cmd(app: App, repo: str, revision: str, target: Target, fmt: str, endpoint: str | None) -> None:
    """The environment that loads REPO at exactly REVISION: FRT_KERNEL_REV_<ID> and LOCAL_KERNELS
    (the commit is staged first if it is not yet)."""
    from frt.mirror.bisect.pin import pin_env
    from frt.mirror.views.env import render_sh

    check_writable(app.root, "pin records what upstream has and stages the commit it pins")
    try:
        pinned = pin_env(repo, revision, target, home=app.home, hub=app.hub(endpoint))
    except KernelUnavailable as e:
        say(f"refused: {e}")
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
@click.option("--timeout", type=Finite(0.001, MAX_SETTING), help="Seconds per run; a run that takes longer is skipped.")
@click.option("--refresh", is_flag=True, help="Scan upstream first even if the ledger knows the range.")
@click.option("--offline", is_flag=True, help="Use only the ledger and what is staged.")
@click.option(
    "--metric",
    metavar="REGEX",
    help="Bisect a performance drift: judge each commit by the figure "
    "CMD prints (the first match on its stdout: group `value`, else the first group).",
)
@click.option(
    "--higher-is-better/--lower-is-better",
    "higher",
    default=None,
    help="The metric's direction (default: lower is better, as for a time).",
)
@click.option("--repeat", type=click.IntRange(max=10_000), help="Runs per commit, for the median (default 5).")
@click.option(
    "--threshold",
    type=Finite(None, 1e6),
    metavar="PCT",
    help="A commit is bad when its median is worse than the good one's by more than PCT (default 5).",
)
@click.option(
    "--interleave",
    is_flag=True,
    help="Alternate each commit's runs with runs of the good commit, and compare it with those.",
)
@endpoint_option
@json_option
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_obj
def bisect_cmd(
    app: App,
    repo: str,
    good: str,
    bad: str,
    target: Target,
    timeout: float | None,
    refresh: bool,
    offline: bool,
    metric: str | None,
    higher: bool | None,
    repeat: int | None,
    threshold: float | None,
    interleave: bool,
    endpoint: str | None,
    as_json: bool,
    cmd: tuple[str, ...],
) -> None:
    """Find the first bad commit of REPO between --good and --bad: each probed commit is staged and
    CMD runs with FRT_KERNEL_REV_<ID> and LOCAL_KERNELS pointing at it. CMD exit: 0 good, 125 skip,
    other bad (as git bisect run); a timeout is a skip. With --metric, a commit is judged by the median
    of the figure CMD prints over --repeat runs, against the good commit's."""
    perf = _metric(metric, higher, repeat, threshold, interleave)
    if not offline:
        check_writable(app.root, "bisect stages the commits it probes (bisect --offline uses only what is staged)")
    common: _Common = {
        "good": good,
        "bad": bad,
        "target": target,
        "cmd": list(cmd),
        "home": app.existing_home if offline else app.home,  # --offline only reads it
        "hub": None if offline else app.hub(endpoint),
        "timeout": timeout,
        "refresh": refresh,
    }
    if perf is not None:
        _bisect_perf(check_repo_id(repo), perf, common, as_json)

    from frt.mirror.bisect.by_revision import bisect

    def show(step: Step) -> None:
        if not as_json:
            code = "timeout" if step.exit_code is None else step.exit_code
            click.echo(
                f"  {step.commit[:12]}  {step.variant}  exit {code}  {step.seconds:.1f}s  {step.verdict}"
                + (f"  ({step.note})" if step.note else ""),
                err=True,
            )

    result = bisect(check_repo_id(repo), **common, on_step=show)
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


def _bisect_perf(repo: str, perf: Metric, common: _Common, as_json: bool) -> NoReturn:
    """The performance mode: each step on stderr as it is decided, then the result; exits."""
    from frt.mirror.bisect.by_metric import bisect_metric

    def progress(step: PerfStep) -> None:
        if not as_json:
            click.echo("  " + "  ".join(str(c) for c in _perf_row(step) if c), err=True)

    result = bisect_metric(repo, metric=perf, **common, on_step=progress)
    if as_json:
        emit_json(result.to_json())
    else:
        click.echo(render_perf(result))
    sys.exit(0 if result.first_bad else 1)


def _metric(
    pattern: str | None, higher: bool | None, repeat: int | None, threshold: float | None, interleave: bool
) -> Metric | None:
    """The performance mode's settings, or None for a correctness bisect (exit codes only)."""
    import re

    from frt.mirror.bisect.by_metric import Metric

    if pattern is None:
        given = [
            name
            for name, v in (
                ("--higher-is-better/--lower-is-better", higher),
                ("--repeat", repeat),
                ("--threshold", threshold),
                ("--interleave", interleave or None),
            )
            if v is not None
        ]
        if given:
            raise BadInput(f"{', '.join(given)}: only with --metric REGEX (a performance bisect)")
        return None
    try:
        compiled = re.compile(pattern)
    except re.error as e:
        raise BadInput(f"--metric {pattern!r}: not a regular expression ({e})") from None
    if repeat is not None and repeat < 1:
        raise BadInput(f"--repeat {repeat}: at least 1")
    if threshold is not None and not threshold > 0:
        raise BadInput(f"--threshold {threshold:g}: a percentage above 0")
    return Metric(
        compiled,
        higher_is_better=bool(higher),
        repeat=repeat or 5,
        threshold=5.0 if threshold is None else threshold,
        interleave=interleave,
    )


def _figure(x: float | None) -> str:
    if x is None:
        return ""
    return f"{x:.1f}" if abs(x) >= 10 else f"{x:.4g}"  # one column of one width for times and rates


def _perf_row(step: PerfStep) -> list[str]:
    change = "" if step.change is None else f"{step.change:+.1f}%"
    spread = "" if step.spread is None else f"{step.spread:.1f}%"
    runs = " ".join(_figure(r) for r in step.runs)
    return [
        step.role,
        step.commit[:12],
        step.variant,
        runs,
        _figure(step.median),
        spread,
        change,
        step.verdict,
        step.reason,
    ]


def render_perf(result: PerfResult) -> str:
    """A performance bisect for people: every step, then the answer (or why there is none)."""
    lines = [f"skipped {sha[:12]}: {why}" for sha, why in result.skipped]
    lines.append(
        table(
            ["step", "commit", "variant", "runs", "median", "spread", "change", "verdict", "why"],
            [_perf_row(s) for s in result.steps],
        )
    )
    if result.stopped:
        lines.append(result.stopped)
    elif result.first_bad:
        lines.append(f"first bad commit: {result.first_bad}  {result.first_bad_date}  {result.first_bad_title}")
    else:
        lines.append("undecided (runs were skipped): first bad is one of " + ", ".join(result.undecided))
    # Only with a figure on record: an end that printed none ("cannot measure") has no median to name.
    if result.good_median is not None and (not result.stopped or result.stopped.startswith("cannot")):
        lines.append(
            f"good median {_figure(result.good_median)}, bad median {_figure(result.bad_median)} "
            f"({result.direction}, threshold {result.threshold:g}%, {result.repeat} runs per commit"
            f"{', interleaved with the good commit' if result.interleave else ''})"
        )
    return "\n".join(lines)
