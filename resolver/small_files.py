"""Small files one run has already read and checked, by git oid: scan reads every variant's metadata.json
(and checks it against the listing's git oid); the stage in the same run stores those bytes instead of
asking the upstream a second time (on the real Hub a resolve and its redirects, in the rate-limited
resolvers' bucket). The mirror verifies them again as it verifies any download (mirror/stage/transport.py)."""

from __future__ import annotations

import threading
from collections import OrderedDict

MAX_BYTES = 16 << 20


class SmallFiles:
    """At most MAX_BYTES in all, the oldest dropped first; safe across a run's threads."""

    def __init__(self, max_bytes: int = MAX_BYTES):
        self.max_bytes = max_bytes
        self._files: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def remember(self, git_oid: str, data: bytes) -> None:
        """Keep bytes the caller checked against `git_oid`."""
        with self._lock:
            self._files[git_oid] = data
            self._files.move_to_end(git_oid)
            total = sum(len(b) for b in self._files.values())
            while total > self.max_bytes and self._files:
                total -= len(self._files.popitem(last=False)[1])

    def get(self, git_oid: str) -> bytes | None:
        with self._lock:
            return self._files.get(git_oid)
