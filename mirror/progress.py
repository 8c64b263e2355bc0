"""A one-line progress meter for long work (stage, bundle, import): bytes, files, rate and ETA, drawn by
tqdm (installed with huggingface_hub) and only on a terminal.

Off the terminal it draws nothing at all: a log or a pipe that reads stderr gets the command's own
lines and no carriage-return debris. The callers pass no meter at all for `--quiet` and `--json`.
"""

from __future__ import annotations

import sys
import threading


class Progress:
    def __init__(self, total_bytes: int, total_files: int, *, label: str = "stage", stream=None):
        from tqdm import tqdm  # here, not at import: the CLI's start-up reads human_bytes from this module

        self.total_files, self.files = total_files, 0
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

    def file_done(self) -> None:
        with self._lock:
            self.files += 1
            if self.enabled:
                self._bar.set_postfix_str(self._files(), refresh=self.files == self.total_files)

    def close(self) -> None:
        with self._lock:
            self._bar.close()


def _isatty(stream) -> bool:
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
