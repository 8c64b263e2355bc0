"""The one way the CLI writes a line to stderr: `frt-mirror: ` and the text on one printable line (a
value from the upstream, a manifest or an option may carry a line break or a bidi control into it)."""

from __future__ import annotations

import click

from frt.resolver.errors import one_line


def say(text: str) -> None:
    click.echo(f"frt-mirror: {one_line(text)}", err=True)
