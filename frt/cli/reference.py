"""The CLI reference (docs/cli.md), rendered from the click commands themselves, so it cannot drift from
what `frt-mirror --help` says: `python -m frt.cli.reference > docs/cli.md` (`make docs`) regenerates it,
and tests/test_docs.py fails when the file is not what this renders.

Every command, subgroups' commands included (`token add`, `key new`), in sorted order: its usage line,
its help text and each option with its help. Nothing here depends on the terminal (click's own help
wraps to its width) or on the environment (defaults are the declared ones, as `--help` shows them).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from typing import TypeGuard

import click

PROG = "frt-mirror"
_TAG_OPEN = re.compile(r"<(?=[A-Za-z/!?])")  # what would open an HTML tag in markdown

_HEADER = """\
# CLI reference

Generated from the click commands by `frt/cli/reference.py`; do not edit: run `make docs`
(`python -m frt.cli.reference > docs/cli.md`). Every command also takes `-h, --help`.
"""


def render() -> str:
    """The whole reference, as markdown."""
    from frt.cli import cli

    contexts = list(_walk(cli, _root_context(cli)))
    toc = "\n".join(f"- [`{c.command_path}`](#{_slug(c.command_path)})" for c in contexts)
    return "\n".join([_HEADER, toc, "", *(_section(c) for c in contexts)]).rstrip("\n") + "\n"


def _root_context(cli: click.Command) -> click.Context:
    return click.Context(cli, info_name=PROG, **cli.context_settings)


def _walk(cmd: click.Command, ctx: click.Context) -> Iterator[click.Context]:
    """This command's context, then each subcommand's, depth first, by name."""
    yield ctx
    if isinstance(cmd, click.Group):
        for name in sorted(cmd.list_commands(ctx)):
            sub = cmd.get_command(ctx, name)  # the top group loads each command's module here (app.COMMANDS)
            if sub is not None and not sub.hidden:
                yield from _walk(sub, click.Context(sub, info_name=name, parent=ctx))


def _section(ctx: click.Context) -> str:
    cmd = ctx.command
    usage = " ".join([ctx.command_path, *cmd.collect_usage_pieces(ctx)])
    parts = [f"## {ctx.command_path}", "", "```", usage, "```", ""]
    for text in (cmd.help, cmd.epilog):
        if text:
            parts += [_text(text), ""]
    if isinstance(cmd, click.Group):
        names = [n for n in sorted(cmd.commands) if not cmd.commands[n].hidden]
        parts += ["Commands: " + ", ".join(f"[`{n}`](#{_slug(f'{ctx.command_path} {n}')})" for n in names), ""]
    options = [_option(p, ctx) for p in cmd.get_params(ctx) if _listed(p, ctx)]
    if options:
        parts += ["Options:", "", *options, ""]
    return "\n".join(parts)


def _listed(param: click.Parameter, ctx: click.Context) -> TypeGuard[click.Option]:
    """Options only (arguments are in the usage line), and not the help option every command has."""
    if not isinstance(param, click.Option) or param.hidden:
        return False
    return not set(param.opts) & set(ctx.help_option_names)


def _option(param: click.Option, ctx: click.Context) -> str:
    record = param.get_help_record(ctx)
    names, help_text = record if record else (", ".join(param.opts), "")
    line = f"- `{names}`"
    return f"{line}: {_inline(help_text)}" if help_text else line


def _text(text: str) -> str:
    """A docstring as click shows it: dedented, cut at \\f, without click's \\b no-rewrap markers."""
    text = inspect.cleandoc(text).split("\f")[0]
    lines = [line for line in text.splitlines() if line.strip() != "\b"]
    return _inline("\n".join(lines).strip())


def _inline(text: str) -> str:
    """Escape a `<` that would open an HTML tag, outside code spans: `FRT_KERNEL_REV_<ID>` is text."""
    pieces = text.split("`")
    return "`".join(p if i % 2 else _TAG_OPEN.sub(r"\\<", p) for i, p in enumerate(pieces))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading of plain words."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


if __name__ == "__main__":
    print(render(), end="")
