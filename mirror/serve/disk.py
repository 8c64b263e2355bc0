"""Pull-through's word on its home's disk: does a pulled file fit, and is the disk full now.

A full disk is a fault of this host, not an outage of the upstream: serve keeps answering (a file the disk
cannot take is passed through unkept: passthrough.py; refs and listings the ledger cannot keep are
answered from memory: unrecorded.py), and says so once in the log, in one line, with the gauge
`frt_mirror_disk_full` on /metrics at 1 for as long as it lasts.

"Full" starts when a write fails for want of space (the `.part` of a fetch, a ledger row) or a file is
larger than the free space less stage's margin (stage/space.py, FRT_DISK_MARGIN_MIB), counting the
fetches this process has in flight. It ends when the free space could take the largest file that did not
fit (checked as files are stored, and when a file is asked for): an operator freed or grew the disk.
"""

from __future__ import annotations

import logging

from frt.resolver.errors import NotEnoughSpace

from ..stage.space import check_space
from ..store.protocol import BlobStore
from .metrics import observe_disk_full

log = logging.getLogger("frt.serve")
MIB = 1 << 20


class DiskState:
    """One serve process's view (each worker its own; the gauge is the workers' max)."""

    def __init__(self, store: BlobStore) -> None:
        self.store = store
        self.reserved = 0  # bytes of the fetches in flight here: each will need its size before it is stored
        self.wanted = 0  # while full: the largest file that did not fit (0: not full)

    @property
    def full(self) -> bool:
        return self.wanted > 0

    def fits(self, size: int) -> bool:
        """Can a file of `size` bytes be fetched into the store now? No: the disk is full (said once)."""
        try:
            check_space(self.store, size + self.reserved)
        except NotEnoughSpace as e:
            self.hit(e, size)
            return False
        if self.full and size >= self.wanted:
            self.cleared()
        return True

    def hit(self, e: BaseException, size: int = MIB) -> None:
        """A write failed for want of space, or a file of `size` did not fit: full from now on."""
        if not self.full:
            log.warning(
                "the home's disk is full (%s): files it cannot take are passed through from the upstream "
                "unkept, refs and listings it cannot record are answered from memory",
                e,
            )
            observe_disk_full(True)
        self.wanted = max(self.wanted, size, 1)

    def stored(self) -> None:
        """A file was stored: is there room again for the largest that did not fit?"""
        if self.full:
            try:
                check_space(self.store, self.wanted + self.reserved)
            except NotEnoughSpace:
                return
            self.cleared()

    def cleared(self) -> None:
        log.info("the home's disk has room again: pulled files are kept again")
        self.wanted = 0
        observe_disk_full(False)
