"""A progress meter for long work (stage, bundle, import): bytes, files, rate and ETA overall, drawn by
tqdm (installed with huggingface_hub) and only on a terminal; under it, one line per large file while it
is on its way (its own bytes, rate and ETA: the overall rate says little while one 2 GiB file goes).

Off the terminal it draws nothing at all: a log or a pipe that reads stderr gets the command's own
lines and no carriage-return debris. The callers pass no meter at all for `--quiet` and `--json`.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import TextIO

BIG_FILE = 4 << 20  # files from this size get a line of their own while they are on their way


class Progress:
    def __init__(self, total_bytes: int, total_files: int, *, label: str = "stage", stream: TextIO | None = None):
        from tqdm import tqdm  # here, not at import: the CLI's start-up reads human_bytes from this module

        self._tqdm, self._stream = tqdm, stream or sys.stderr
        self.total_files, self.files = total_files, 0
        self._slots: set[int] = set()  # terminal lines below the overall one, taken by large files
        stream = stream or sys.stderr
        self.enabled = _isatty(stream)
        # Downloads report from several threads; tqdm's update is not atomic, so ours serializes them.
        self._lock = threading.Lock()
        self._bar = tqdm(
            total=total_bytes,
            desc=label,
            file=stream,
            disable=not self.enabled,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            dynamic_ncols=True,
            leave=True,
            postfix=self._files(),
        )

    def _files(self) -> str:
        return f"{self.files}/{self.total_files} files"

    def add_bytes(self, n: int) -> None:
        if self.enabled:
            with self._lock:
                self._bar.update(n)

    def file(self, name: str, size: int) -> tuple[Callable[[int], None], Callable[[bool], None]]:
        """A file starting: (add its bytes, it ended: done(ok)). A large one has a line of its own until it
        ends; only one that ended ok counts as a file done."""
        if not self.enabled or size < BIG_FILE:
            return self.add_bytes, lambda ok: self.file_done() if ok else None
        with self._lock:
            slot = min(set(range(1, len(self._slots) + 2)) - self._slots)
            self._slots.add(slot)
            bar = self._tqdm(
                total=size,
                desc=f"  {name[-40:]}",
                file=self._stream,
                position=slot,
                leave=False,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                dynamic_ncols=True,
            )

        def add(n: int) -> None:
            with self._lock:
                bar.update(n)
                self._bar.update(n)

        def done(ok: bool) -> None:
            with self._lock:
                bar.close()
                self._slots.discard(slot)
            if ok:
                self.file_done()

        return add, done

    def file_done(self) -> None:
        with self._lock:
            self.files += 1
            if self.enabled:
                self._bar.set_postfix_str(self._files(), refresh=self.files == self.total_files)

    def close(self) -> None:
        with self._lock:
            self._bar.close()


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or file-like stream without a terminal behind it
        return False


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError
