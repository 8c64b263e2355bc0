"""The `frt-mirror` CLI: the top of the house, above every layer it composes (resolver, mirror, seats,
adapters). Each command parses, calls one API function, and renders its result as a table or JSON; its
module is imported only when it runs (app.COMMANDS).

Exit codes: 0 ok, 1 refused or failed verification, 2 bad usage or bad input, 3 the upstream (or the
ledger's database) unavailable: try again later, 4 a local disk error (full, or short of what a stage needs),
130 interrupted, 141 stdout's reader gone (`| head`).
"""

from __future__ import annotations

from .app import cli


def main() -> None:
    cli(prog_name="frt-mirror")


__all__ = ["cli", "main"]
