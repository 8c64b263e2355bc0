"""A big file's fetch in flight, as the answers that stream it read it (pull.PullService.begin, stream.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from .catalog import ServedFile


@dataclass(eq=False)
class Flow:
    """A big file's fetch in flight, as the answers streaming it read it: the `.part` file it grows,
    its size, and the flight (a future of the stored ServedFile). `written` counts bytes written to
    the part, `restarts` the times it began again from byte 0 (bytes sent before that may differ)."""

    part: Path
    size: int
    key: str
    path: str
    done: asyncio.Future[ServedFile] | None = None
    written: int = 0
    restarts: int = 0

    def wrote(self, n: int) -> None:  # the fetch's on_bytes, in its thread: plain int updates
        if n < 0:
            self.restarts += 1
        else:
            self.written += n
