"""The one way the CLI writes a line to stderr: `frt-mirror: ` and the text on one printable line (a
value from the upstream, a manifest or an option may carry a line break or a bidi control into it)."""

from __future__ import annotations

import sys

import click

from frt.resolver.errors import one_line


def say(text: str) -> None:
    click.echo(f"frt-mirror: {one_line(text)}", err=True)


def say_waiting(bucket: str, seconds: float) -> None:
    """A 429 window being waited out (resolver/pacing.py), one line each: above a progress meter where one
    is drawn (tqdm's write clears and redraws it), plain otherwise."""
    from tqdm import tqdm

    tqdm.write(f"frt-mirror: waiting {seconds:.0f} s: the upstream's {one_line(bucket)} window (429)", file=sys.stderr)
