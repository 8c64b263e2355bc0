"""One blob member of a bundle copied out of the archive and hashed in one pass, at about `tar -x`'s pace.

The member's bytes are read with pread(2) straight from the archive's descriptor into one of two
reused buffers (tarfile's reader would copy each chunk twice more), and written with write(2) from the
same buffer: what is hashed is exactly what is written, even if the archive changes under the import.
sha256 runs on a helper thread, one buffer behind the caller, which does the git sha1 and the write
(hashlib lets go of the GIL on large buffers), so the copy runs at the pace of the slower of the two.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from concurrent.futures import Future

from ..store import Digest
from .format import SHA256_HELPER, BundleRejected

CHUNK = 4 << 20  # fewer system calls and hash calls per MiB than 1 MiB; two of them live at once
SMALL = 64 << 10


class MemberCopier:
    """Copies members of one archive (its descriptor `src`) with two buffers it keeps between them."""

    def __init__(self, src: int):
        self.src = src
        self._bufs = (bytearray(CHUNK), bytearray(CHUNK))

    def copy(self, offset: int, size: int, out: int | None, on_bytes: Callable[[int], None] | None = None) -> Digest:
        """The digest of the `size` bytes at `offset`, written to the descriptor `out` (None: only hashed)."""
        h256, hgit = hashlib.sha256(), hashlib.sha1(f"blob {size}\0".encode())
        pending: Future | None = None
        at, left, i = offset, size, 0
        try:
            while left:
                # This buffer's last sha256 was waited for before the other one was handed over.
                view = memoryview(self._bufs[i & 1])[: min(CHUNK, left)]
                n = os.preadv(self.src, [view], at)
                if n == 0:
                    raise BundleRejected(f"the archive ends inside a blob member ({left} bytes short)")
                view = view[:n]
                if pending is not None:
                    pending.result()
                if n >= SMALL:
                    pending = SHA256_HELPER.submit(h256.update, view)
                else:  # a hop to the helper costs more than hashing a small file here
                    pending = None
                    h256.update(view)
                hgit.update(view)
                if out is not None:
                    _write_all(out, view)
                if on_bytes is not None:
                    on_bytes(n)
                at, left, i = at + n, left - n, i + 1
        finally:
            if pending is not None:
                pending.result()  # never leave the helper reading a buffer the next copy overwrites
        return Digest(h256.hexdigest(), hgit.hexdigest(), size)


def _write_all(fd: int, view: memoryview) -> None:
    done = 0
    while done < len(view):
        done += os.write(fd, view[done:])
