"""The `frt-mirror` command group, its options and its one error mapping; the commands live beside it.

Each command parses arguments, calls one function, renders a table or JSON.
Exit codes: 0 ok, 1 refused or failed verification, 2 bad usage or bad input, 3 the upstream (or the
ledger's database) unavailable: try again later, 4 a local disk error (full, or short of what a stage needs).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from frt.mirror.home_path import (
    check_existing_home,
    check_ledger_text,
    check_store_url,
    default_home,
    default_ledger_url,
)
from frt.resolver.errors import BadInput, FrtError, error_line, exit_code

from .say import say, stdout_gone

if TYPE_CHECKING:  # the home, the ledger and the Hub client are imported by the commands that use them
    from frt.mirror.store.home import Home
    from frt.resolver.hub import HubClient
    from frt.resolver.ledger import Ledger
    from frt.resolver.targets import Target


@dataclass
class App:
    root: Path
    endpoint: str | None
    ledger_url: str | None = None
    store_url: str | None = None
    _home: Home | None = None
    _hubs: dict[str, HubClient] = field(default_factory=dict)

    @property
    def home(self) -> Home:
        """The home every command works on (its root made absolute: views and LOCAL_KERNELS name it)."""
        if self._home is None:
            from frt.mirror.store.home import Home

            self._home = Home(self.root.absolute(), ledger_url=self.ledger_url, store_url=self.store_url)
        return self._home

    @property
    def existing_home(self) -> Home:
        """The home of a command that only reads it: one that does not exist, or has no ledger, is refused
        in one line (home_path.check_existing_home), and nothing is created."""
        check_existing_home(self.root.absolute(), self.ledger_url or default_ledger_url())
        return self.home

    @property
    def reading_home(self) -> Home:
        """The home of a command that only reads it (existing_home) and must work on a full disk too, as
        the commands that tell an operator what is there do: there its SQLite ledger is opened read-only,
        which needs no new space (Home.reads_when_full), and what it would have written is skipped."""
        home = self.existing_home
        home.reads_when_full = True
        return home

    @property
    def ledger(self) -> Ledger:
        return self.home.ledger

    def ride_out(self) -> None:
        """This command writes the ledger: it retries each ledger unit that a restarting server cut, for
        up to FRT_LEDGER_RETRY_S (resolver/ledger/retry.py), until the command ends. Called before the
        home is opened."""
        from frt.resolver.ledger.retry import riding_out

        click.get_current_context().with_resource(riding_out())

    def hub(self, endpoint: str | None, *, quiet: bool = False) -> HubClient:
        """The upstream's client for this command, one per upstream: every part of the command (a stage's
        kernels, models and wheels) shares its pacer, so all of them spend one quota knowingly. Unless
        `quiet`, each rate-limit window it waits for is one line on stderr."""
        from frt.resolver.hub import HubClient, resolve_endpoint

        from .say import say_waiting

        quiet_hub_logging()
        url = resolve_endpoint(endpoint or self.endpoint)
        hub = self._hubs.get(url)
        if hub is None:
            hub = self._hubs[url] = HubClient(url)
        if not quiet:
            hub.pacer.on_wait = say_waiting
        return hub


def quiet_hub_logging() -> None:
    """huggingface_hub logs its own retries ("Retrying in 2s") to stderr; ours report the outcome in one
    line, so its chatter would break the one-line error contract. Called by each command that reaches an
    upstream, not at start-up: importing huggingface_hub costs more than most commands do."""
    import logging

    from huggingface_hub.utils import logging as hf_logging

    hf_logging.set_verbosity(logging.ERROR)  # what its set_verbosity_error() does (that one is unannotated)


# Every command: the module of frt.cli that defines it, and the line `frt-mirror --help` lists it by.
# Each command's module is imported when that command runs, not before (click's lazy-loading group:
# https://click.palletsprojects.com/en/stable/complex/#lazily-loading-subcommands), so start-up is
# click's own and the listing needs none of them. tests/test_cli_lazy.py holds the table to the modules.
COMMANDS: dict[str, tuple[str, str]] = {
    "bisect": ("bisect_cmds", "Find the first bad commit of REPO between two revisions."),
    "bundle": ("stage_cmds", "Write OUT.tar: the staged set, to carry across an air gap."),
    "demand": ("demand_cmds", "What the fleet asked serve for (see report --demand)."),
    "env": ("env_cmd", "What a cluster sets: LOCAL_KERNELS, HF_ENDPOINT, engines."),
    "export-cache": ("stage_cmds", "Write a Hub cache for a target that works offline."),
    "gc": ("gc_cmds", "Remove blobs nothing references, and dead partial downloads."),
    "import": ("stage_cmds", "Verify every file of IN.tar, then add it to the home."),
    "key": ("key_cmd", "Keys that sign bundles and check them on the cluster."),
    "ledger": ("rebuild_cmd", "Rebuild the ledger from the records in the store, offline."),
    "matrix": ("ledger_cmds", "Availability: revision × variant, and the targets each serves."),
    "nginx-conf": ("nginx_cmd", "Print an nginx.conf for nginx in front of serve replicas."),
    "pin": ("bisect_cmds", "The environment that loads REPO at exactly REVISION."),
    "report": ("ledger_cmds", "Every refusal on record: repo, version, target, error."),
    "resolve": ("ledger_cmds", "Resolve REPO for a target: the commit, variant and files."),
    "scan": ("ledger_cmds", "Record refs, history and build variants of REPOS."),
    "serve": ("serve_cmds", "Serve the staged set as a read-only Hub endpoint."),
    "stage": ("stage_cmds", "Fetch exactly the files the targets need, verified."),
    "token": ("token_cmds", "Bearer tokens for serve."),
    "unstage": ("gc_cmds", "Drop a staged set; then gc reclaims its blobs."),
    "verify": ("stage_cmds", "Re-hash every blob and check every view link."),
}


class _Group(click.Group):
    """The commands of COMMANDS, each loaded when asked for. Turns every FrtError, and click's own usage
    errors, into one line on stderr and the contract's exit code (click prints a usage block, a hint and
    the error: four lines for one bad value)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in COMMANDS and cmd_name not in self.commands:
            importlib.import_module(f"{__package__}.{COMMANDS[cmd_name][0]}")  # its commands register on cli
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The listing from COMMANDS' lines: no command's module is imported to print it."""
        with formatter.section("Commands"):
            formatter.write_dl([(name, line) for name, (_, line) in sorted(COMMANDS.items())])

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.ClickException as e:  # an option of frt-mirror itself (--home, --ledger, ...)
            _usage_error(ctx, e)

    def invoke(self, ctx: click.Context) -> Any:  # a command's callback's result, as click.Group's own
        try:
            return super().invoke(ctx)
        except click.ClickException as e:  # a command's options and arguments, parsed in here
            _usage_error(getattr(e, "ctx", None) or ctx, e)
        except BrokenPipeError as e:  # `frt-mirror … | head`: the reader has what it wanted
            stdout_gone()
            ctx.exit(exit_code(e))
        except (FrtError, OSError, KeyboardInterrupt) as e:  # the contract's map, whole (resolver/errors.py)
            say(error_line(e))
            ctx.exit(exit_code(e))


# click >= 8.2 raises this for a bare group (its help, exit 2); older click prints the help itself.
_NO_ARGS = getattr(click.exceptions, "NoArgsIsHelpError", ())


def _usage_error(ctx: click.Context, e: click.ClickException) -> NoReturn:
    if isinstance(e, _NO_ARGS):  # `frt-mirror` or a group alone: its help, as click shows it
        raise e
    hint = f" (see {ctx.command_path} --help)" if isinstance(e, click.UsageError) else ""
    say(f"{' '.join(e.format_message().split())}{hint}")
    ctx.exit(e.exit_code)


force_option = click.option("--force", is_flag=True, help="Replace the file if it exists (default: refuse).")


class Finite(click.FloatRange):
    """A float option within [low, high] and finite: click's FloatRange lets nan through (every
    comparison with nan is false), and nan seconds reach a socket timeout or a sleep as a traceback."""

    def __init__(self, low: float | None, high: float) -> None:
        super().__init__(low, high)

    def convert(self, value: float, param: click.Parameter | None, ctx: click.Context | None) -> float:
        number = super().convert(value, param, ctx)
        if number != number:
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        return number


def parse_targets(
    _ctx: click.Context, _param: click.Parameter, values: str | Sequence[str] | None
) -> Target | tuple[Target, ...] | None:
    from frt.resolver.targets import parse_target

    if values is None:
        return None
    if isinstance(values, str):
        return parse_target(values)
    return tuple(parse_target(v) for v in values)


def parse_repo_versions(_ctx: click.Context, _param: click.Parameter, values: Sequence[str] | None) -> dict[str, int]:
    out: dict[str, int] = {}
    if not values:
        return out
    from frt.manifests.fields import MAX_INT
    from frt.resolver.gate import check_repo_id

    for v in values:
        repo, sep, n = v.rpartition("=")
        if not sep or not repo or not (n.isascii() and n.isdigit() and int(n[:11]) <= MAX_INT):
            raise BadInput(
                f"--version {v!r}: expected REPO=N (N up to {MAX_INT}), e.g. --version kernels-community/activation=1"
            )
        check_repo_id(repo)
        out[repo] = int(n)
    return out


def emit_json(doc: object) -> None:
    import json

    click.echo(json.dumps(doc, indent=2, default=str))


endpoint_option = click.option("--endpoint", metavar="URL", help="Upstream Hub or mirror (default: $HF_ENDPOINT).")
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")


@click.group(
    cls=_Group,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="Exit codes: 0 ok; 1 refused or failed verification; 2 bad usage or input; 3 the upstream "
    "(or the ledger's database) unavailable: try again later; 4 a local disk error (full, or short of what a "
    "stage needs).",
)
@click.option(
    "--home",
    type=click.Path(file_okay=False, path_type=Path),
    help="State directory (default: $FRT_MIRROR_HOME, else the platform's user data dir).",
)
@click.option(
    "--ledger",
    "ledger_url",
    metavar="URL",
    help="Where the ledger lives: a SQLAlchemy URL, "
    "postgresql://USER@HOST:PORT/DB for one ledger several hosts share (pip install "
    "'frt-mirror[postgres]') or sqlite:///PATH (default: $FRT_LEDGER_URL, else SQLite in the home).",
)
@click.option(
    "--store",
    "store_url",
    metavar="URL",
    help="Where the blobs live: s3://BUCKET/PREFIX for an S3-compatible object store (endpoint and "
    "credentials from AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, …; pip install 'frt-mirror[s3]'; the ledger then on "
    "PostgreSQL) (default: $FRT_STORE_URL, else files under the home).",
)
@endpoint_option
@click.version_option(package_name="frt-mirror")
@click.pass_context
def cli(
    ctx: click.Context, home: Path | None, ledger_url: str | None, store_url: str | None, endpoint: str | None
) -> None:
    """Resolve, stage, verify and serve Hugging Face Hub kernels for offline clusters."""
    # Before huggingface_hub is imported: it parses HF_ENDPOINT at import, and `http://[::1` or a port
    # past 65535 there was its ValueError traceback, whatever the command.
    if os.environ.get("HF_ENDPOINT"):
        from frt.resolver.gate import check_endpoint

        check_endpoint(os.environ["HF_ENDPOINT"], where="HF_ENDPOINT")
    if ledger_url is not None:
        check_ledger_text(ledger_url, where="--ledger")
    if store_url is not None:
        store_url = check_store_url(store_url, where="--store")
    ctx.obj = App(root=home or default_home(), endpoint=endpoint, ledger_url=ledger_url, store_url=store_url)
    ctx.call_on_close(lambda: ctx.obj._home and ctx.obj._home.close())
