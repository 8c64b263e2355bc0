"""The fleet's demand (mirror/serve/demand_records.py): `report --demand` (ledger_cmds.report_cmd calls here) and
`demand manifest`, which writes the misses as a manifest for `stage` on the connected box."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import TYPE_CHECKING

import click

from .app import App, cli, emit_json
from .render import table

if TYPE_CHECKING:
    from frt.mirror.serve.demand_records import DemandLine

    _ParamType = click.ParamType[timedelta]
else:  # click < 8.4's ParamType is not generic (pyproject: click>=8.1)
    _ParamType = click.ParamType

_UNITS = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class Duration(_ParamType):
    """`30m`, `12h`, `7d`, `2w`: a window back from now."""

    name = "DURATION"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> timedelta:
        if isinstance(value, timedelta):
            return value
        m = re.fullmatch(r"(\d{1,6})([mhdw])", str(value).strip())
        if not m or int(m[1]) == 0:
            self.fail(f"{value!r} is not a duration: expected a number and m, h, d or w (30m, 12h, 7d, 2w)", param, ctx)
        return timedelta(seconds=int(m[1]) * _UNITS[m[2]])


since_option = click.option(
    "--since",
    type=Duration(),
    help="Only the last DURATION (30m, 12h, 7d, 2w); counts are kept per UTC day, so whole days.",
)


def demand_lines(app: App, since: timedelta | None) -> list[DemandLine]:
    from frt.mirror.serve.demand_records import demand_lines as lines

    home = app.reading_home
    return lines(home.ledger, home.staged(), since)


def report_demand(app: App, since: timedelta | None, as_json: bool) -> None:
    """`report --demand`: per repo x target, requests, last seen, what was served and what missed, and
    the tiers below it came through (`asked at`, `via` in --json: here, or cluster > region)."""
    lines = demand_lines(app, since)
    if as_json:
        emit_json([_line_json(d) for d in lines])
        return
    if not lines:
        click.echo("no requests from kernels clients on record" + (" in that window" if since else ""))
        return
    rows = [
        (
            d.repo,
            d.target or "(not named)",
            d.requests,
            f"{d.last_seen:%Y-%m-%d %H:%M}",
            ", ".join(d.served) or "-",
            "; ".join(f"{m.text} ({m.count}x)" for m in d.misses) or "-",
            "; ".join(d.via) or "here",
        )
        for d in lines
    ]
    heads = ["repo", "target", "requests", "last seen (UTC)", "served", "not answered", "asked at"]
    click.echo(table(heads, rows))
    if any(d.via for d in lines):
        click.echo("\nasked at: the tiers below that handed the counts on, nearest the client first")
    open_misses = sum(len(d.open_misses) for d in lines)
    if open_misses:
        click.echo(
            f"\n{open_misses} miss(es) not staged since: frt-mirror demand manifest > more.toml, then "
            "stage more.toml on the connected box"
        )


def _line_json(d: DemandLine) -> dict[str, object]:
    return {
        "repo": d.repo,
        "target": d.target,
        "requests": d.requests,
        "last_seen": d.last_seen.isoformat(),
        "served": list(d.served),
        "via": list(d.via),  # origin chains of counts handed on by tiers below ([]: this mirror's own)
        "misses": [
            {
                "asked": m.asked,
                "outcome": m.outcome,
                "reason": m.text,
                "count": m.count,
                "last_seen": m.last_seen.isoformat(),
                "staged_since": m.staged_since,
            }
            for m in d.misses
        ],
    }


@cli.group("demand")
def demand_group() -> None:
    """What the fleet asked serve for (see report --demand)."""


@demand_group.command("manifest")
@since_option
@click.pass_obj
def demand_manifest_cmd(app: App, since: timedelta | None) -> None:
    """Print a manifest of every miss not staged since: stage it on the connected box."""
    from frt.mirror.serve.demand_records import misses_manifest

    text, count = misses_manifest(demand_lines(app, since))
    if not count:
        click.echo("frt-mirror: nothing the fleet asked for is missing: no manifest written", err=True)
        return
    click.echo(text, nl=False)
    click.echo(f"frt-mirror: {count} miss(es) in the manifest", err=True)
