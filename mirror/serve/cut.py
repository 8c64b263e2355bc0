"""An answer ended short on purpose: bytes already sent cannot be vouched for (a file that failed its
hash, a fetch that started over), so the answer returns with its body incomplete and the server closes
the connection. The client is left with an `.incomplete` file, never a whole wrong one.

Each cut says why in one line of its own; uvicorn's line for the same connection ("ASGI callable
returned without completing response") is then dropped by CutSaid, since an operator would take it
for a bug. Any other incomplete answer is still logged.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar

log = logging.getLogger("frt.serve")
_cut_said = ContextVar("frt_serve_cut_said", default=False)  # per request: uvicorn runs each in a task of its own
INCOMPLETE = "ASGI callable returned without completing response."


def cut(path: str, sent: int, size: int, why: object) -> int:
    """Say why the answer for `path` ends after `sent` of its `size` bytes; returns `sent` (what the
    answer returns: the body bytes sent)."""
    log.warning("frt-mirror: serve: %s: answer cut after %d of %d bytes: %s", path, sent, size, why)
    _cut_said.set(True)
    return sent


class CutSaid(logging.Filter):
    """Drops uvicorn's error line for an answer that returned incomplete where `cut` said why."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == INCOMPLETE and _cut_said.get())
