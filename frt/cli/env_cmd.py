"""env: what a cluster job sets — LOCAL_KERNELS, HF_ENDPOINT, and the engines' side (the one command
that composes the mirror and the adapters)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from frt.mirror.home_path import HomeLayout
from frt.resolver.errors import EXIT_REFUSED, BadInput

from .app import App, cli, emit_json, parse_repo_versions, parse_targets
from .say import say

if TYPE_CHECKING:
    from frt.mirror.views.env import EnvEntry
    from frt.resolver.targets import Target


@cli.command("env")
@click.option(
    "--target",
    "target",
    callback=parse_targets,
    help="The cluster's target (for LOCAL_KERNELS); its @archs go in HF_HUB_USER_AGENT_ORIGIN (with --serve too), "
    "so the mirror's demand names the node's GPUs.",
)
@click.option(
    "--serve", "serve_url", metavar="URL", help="Print the cluster side of 'frt-mirror serve' at URL instead."
)
@click.option(
    "--engine",
    type=click.Choice(["vllm", "sglang"]),
    help="Also the serving engine's side: the seat adapters from PYTHONPATH (writes --python-dir).",
)
@click.option(
    "--seats",
    "seats",
    type=click.Path(dir_okay=False, path_type=Path),
    help="With --engine: the seat catalog the engine's workers attach (FRT_SEATS).",
)
@click.option(
    "--python-dir",
    "python_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="With --engine: where to write the frt package and its plugin dist-info [default: HOME/python].",
)
@click.option(
    "--version",
    "versions",
    multiple=True,
    metavar="REPO=N",
    callback=parse_repo_versions,
    help="With --target: the staged version LOCAL_KERNELS points at for REPO (repeatable); "
    "needed where several versions of a repo are staged.",
)
@click.option(
    "--into",
    "into",
    type=click.Path(file_okay=False, path_type=Path),
    help="On an object store (--store s3://…): write the target's variant folders (and wheels) here, each "
    "file streamed and verified, and point LOCAL_KERNELS at them.",
)
@click.option("--format", "fmt", type=click.Choice(["sh", "json"]), default="sh", show_default=True)
@click.pass_obj
def env_cmd(
    app: App,
    target: Target | None,
    serve_url: str | None,
    engine: str | None,
    seats: Path | None,
    python_dir: Path | None,
    versions: dict[str, int],
    into: Path | None,
    fmt: str,
) -> None:
    """What a cluster sets: LOCAL_KERNELS for a target's staged set (one path per repo: a repo staged at
    several versions is left out, exit 1, unless --version REPO=N or a pin chooses; export-cache and
    serve carry every version), or with --serve, HF_ENDPOINT for a running mirror. A target naming its
    GPUs (T@8.0,9.0) adds HF_HUB_USER_AGENT_ORIGIN=frt-archs:8.0,9.0 after any words already there, so
    the mirror's demand counts the node's archs (kernels' User-Agent names none). With --engine, also what a
    vLLM or SGLang job sets to attach seats in its workers without installing anything: PYTHONPATH
    (the frt package and the plugin's dist-info, written to --python-dir), FRT_MIRROR_HOME, FRT_SEATS
    and the engine's plugin allow-list."""
    from frt.mirror.views.env import TELEMETRY_WARNING, endpoint_vars, env_vars, local_kernels, pip_line, render_sh
    from frt.resolver.agent_archs import ENV as ORIGIN_ENV
    from frt.resolver.agent_archs import origin_value

    if (seats or python_dir) and not engine:
        raise BadInput("--seats and --python-dir go with --engine vllm|sglang")
    values: dict[str, str] = {}
    entries: list[EnvEntry] = []
    warnings: list[str] = []
    refused: list[str] = []
    if into is not None and target is None:
        raise BadInput("--into DIR goes with --target (it is where that target's files are written)")
    if versions and (serve_url or target is None):
        raise BadInput("--version REPO=N goes with --target (it picks what LOCAL_KERNELS points at)")
    if serve_url:
        values = endpoint_vars(serve_url)
    elif target is not None:
        chosen = local_kernels(app.reading_home, target, versions=versions, into=into)
        entries, warnings, refused = chosen.entries, chosen.warnings, chosen.refused
        values = env_vars(entries)
    elif not engine:
        raise BadInput("give --target T (LOCAL_KERNELS), --serve URL (HF_ENDPOINT) or --engine vllm|sglang")
    if target is not None and (origin := origin_value(target, os.environ.get(ORIGIN_ENV))) is not None:
        values[ORIGIN_ENV] = origin  # its GPUs in every User-Agent, for the mirror's demand (agent_archs.py)
    if engine:
        from frt.adapters.distinfo import write_python_dir
        from frt.adapters.engine_env import check_catalog, engine_vars

        catalog = check_catalog(seats) if seats else None
        where = (python_dir or HomeLayout(app.root).python).absolute()
        values.update(engine_vars(engine, where, app.home.root, catalog))  # checks before writing
        write_python_dir(where)
    if fmt == "json":
        emit_json(
            {
                "env": values,
                "warnings": [*warnings, TELEMETRY_WARNING],
                "refused": refused,
                "kernels": [
                    {
                        "repo": e.repo,
                        "requested": e.requested,
                        "commit": e.commit,
                        "variant": e.variant,
                        "path": str(e.path),
                        "wheels": list(e.wheels),
                    }
                    for e in entries
                ],
                "pip_install": pip_line(w for e in entries for w in e.wheels),
                **({"engine": engine, "python_dir": values["PYTHONPATH"]} if engine else {}),
            }
        )
        sys.exit(EXIT_REFUSED if refused else 0)
    for w in warnings:
        say(f"warning: {w}")
    for line in refused:
        say(f"refused: {line}")
    for e in entries:
        click.echo(f"# {e.repo} {e.requested} → {e.commit[:12]} {e.variant}")
    click.echo(f"# warning: {TELEMETRY_WARNING}")
    if install := pip_line(w for e in entries for w in e.wheels):
        click.echo(f"# python-depends: after these exports, run once in the job's environment: {install}")
    if engine:
        click.echo(
            f"# {engine}: PYTHONPATH holds frt and its plugin; put it before any PYTHONPATH you have. "
            "The plugin allow-list is exclusive: add your other plugins, comma-separated."
        )
        if not seats:
            click.echo(
                "# set FRT_SEATS=<catalog.toml> (a seat catalog) to attach seats; unset, the plugin does nothing"
            )
        if engine == "sglang":
            click.echo(
                "# SGLang without sglang.srt.plugins (before 0.5.23): frt.adapters.sglang_engine.install(DIR) "
                "writes a sitecustomize; put DIR first on PYTHONPATH and set FRT_SGLANG_ATTACH=1"
            )
    click.echo(render_sh(values))
    sys.exit(EXIT_REFUSED if refused else 0)  # the rest are exported all the same, above
