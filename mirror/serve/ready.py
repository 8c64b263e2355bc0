"""serve tells whatever started it when it can answer: `--ready-file PATH`, and systemd's notify socket.

A supervisor or a load balancer that takes an open port for "up" was wrong about serve: a replica started
while the ledger was down took connections for seconds and then exited 3, having no catalog to answer
from. serve now listens only once its catalog is loaded (listen.py), and says so here, at the moment it can
answer, never before:

- the ready file: one line, `PID URL` (serve's own pid, the main process with --workers, and the URL it
  answers on), written atomically (temp file, fsync, rename), so a reader sees it whole or not at all.
  Removed when serve starts (a file left by a serve killed with -9 must not say ready) and when it stops.
- `$NOTIFY_SOCKET` (systemd's `Type=notify`, sd_notify(3)): `READY=1`, `MAINPID=` and a `STATUS=` line,
  then `STOPPING=1` at SIGTERM or SIGINT. A unix datagram socket, in the abstract namespace when the name
  starts with '@'; the stdlib's socket module speaks it, so there is no dependency on libsystemd.

Each is told once: a worker restarted later changes neither (`serve --workers`: see workers.py).
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from frt.resolver.errors import BadInput
from frt.resolver.fs import atomic_write


class Readiness:
    """What serve tells its supervisor. `path`: --ready-file (None: no file). The notify socket is taken out
    of the environment here, so that nothing serve starts (a worker, a child) speaks for it."""

    def __init__(self, path: Path | None, url: str):
        self.path = path.absolute() if path is not None else None
        self.url = url
        self.notify = _address(os.environ.pop("NOTIFY_SOCKET", ""))
        self.told_ready = False
        self.told_stopping = False

    def check(self) -> None:
        """Before anything starts: a ready file that cannot be written is bad input now (one line, exit 2),
        not a serve that never says it is ready; one left by an earlier serve is removed."""
        if self.path is None:
            return
        try:
            if self.path.is_dir():
                raise IsADirectoryError(21, "a folder")
            self.path.unlink(missing_ok=True)
            atomic_write(self.path.with_name(f".{self.path.name}.check"), b"").unlink()
        except OSError as e:
            raise BadInput(f"--ready-file {self.path}: cannot write it ({e.strerror or e})") from None

    def ready(self, status: str) -> None:
        """serve can answer: the file, then READY=1. Once; never after stopping began."""
        if self.told_ready or self.told_stopping:
            return
        self.told_ready = True
        if self.path is not None:
            try:
                atomic_write(self.path, f"{os.getpid()} {self.url}\n")
            except OSError as e:  # checked at start: the disk filled or the folder went since
                _warn(f"cannot write the ready file {self.path} ({e.strerror or e})")
        self._send(f"READY=1\nMAINPID={os.getpid()}\nSTATUS={_one_line(status)}")

    def stopping(self) -> None:
        """Stopping began (a signal; or serve ends for another reason): the file goes, then STOPPING=1. Once."""
        if self.told_stopping:
            return
        self.told_stopping = True
        if self.path is not None and self.told_ready:
            try:
                self.path.unlink(missing_ok=True)
            except OSError as e:
                _warn(f"cannot remove the ready file {self.path} ({e.strerror or e})")
        self._send("STOPPING=1\nSTATUS=stopping: finishing the requests in flight")

    def _send(self, message: str) -> None:
        if self.notify is None:
            return
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                s.sendto(message.encode(), self.notify)
        except OSError as e:  # systemd then times the start out: worth a line, not worth not serving
            _warn(f"cannot tell NOTIFY_SOCKET ({e.strerror or e}): {message.splitlines()[0]}")


def _address(name: str) -> str | bytes | None:
    """NOTIFY_SOCKET as socket.sendto takes it: '@' is the abstract namespace's leading NUL byte."""
    if not name:
        return None
    return b"\0" + name[1:].encode() if name.startswith("@") else name


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _warn(text: str) -> None:
    print(f"frt-mirror: warning: {text}", file=sys.stderr, flush=True)
