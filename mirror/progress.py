"""A one-line progress meter (bytes and files) for long work, drawn only on a terminal."""

from __future__ import annotations

import sys
import threading
import time

from .render import human_bytes


class Progress:
    def __init__(self, total_bytes: int, total_files: int, *, label: str = "stage", stream=None):
        self.total_bytes, self.total_files, self.label = total_bytes, total_files, label
        self.bytes = self.files = 0
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty()
        self._lock = threading.Lock()
        self._last = 0.0
        self._start = time.monotonic()

    def add_bytes(self, n: int) -> None:
        with self._lock:
            self.bytes += n
            self._draw()

    def file_done(self) -> None:
        with self._lock:
            self.files += 1
            self._draw(force=self.files == self.total_files)

    def _draw(self, force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self._last < 0.1):
            return
        self._last = now
        rate = self.bytes / max(now - self._start, 1e-6)
        self.stream.write(f"\r{self.label}: {human_bytes(self.bytes)}/{human_bytes(self.total_bytes)}  "
                          f"{self.files}/{self.total_files} files  {human_bytes(int(rate))}/s   ")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self._draw(force=True)
            self.stream.write("\n")
            self.stream.flush()
