"""The one way the CLI writes a line to stderr: `frt-mirror: ` and the text on one printable line (a
value from the upstream, a manifest or an option may carry a line break or a bidi control into it)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from frt.resolver.errors import one_line

if TYPE_CHECKING:
    from frt.resolver.pacing import Wait


def say(text: str) -> None:
    click.echo(f"frt-mirror: {one_line(text)}", err=True)


def say_waiting(wait: Wait) -> None:
    """A rate-limit window being waited for (resolver/pacing.py), one line a window: above a progress
    meter where one is drawn (tqdm's write clears and redraws it), plain otherwise."""
    from tqdm import tqdm

    tqdm.write(f"frt-mirror: {waiting_line(wait)}", file=sys.stderr)


def waiting_line(wait: Wait) -> str:
    """`waiting 7 s for the upstream's api window (8 per 10 s): 41 of 63 listings left, about 40 s`"""
    quota = f" ({wait.quota} per {wait.window:g} s)" if wait.quota and wait.window else ""
    line = f"waiting {max(1, round(wait.seconds))} s for the upstream's {one_line(wait.bucket)} window{quota}"
    if wait.work is not None:
        noun, left, total = wait.work
        line += f": {left} of {total} {noun} left"
        if wait.eta is not None:
            line += f", about {max(1, round(wait.eta))} s"
    return line


def stdout_gone() -> None:
    """The reader of stdout went away (`frt-mirror … | head`): stdout is pointed at /dev/null, so that
    the interpreter's own flush at exit has nowhere to fail and nothing is said about it."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
