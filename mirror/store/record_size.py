"""The bound on a ledger record's size in the store (row_records.py), which both stores read under."""

from __future__ import annotations

# A record is one staged row's manifest: kilobytes, a few hundred for a row of thousands of files. A file
# in records/ past this was not written by a stager: it is refused unread, not loaded into memory whole.
RECORD_MAX = 16 << 20


class RecordTooBig(ValueError):
    def __init__(self, name: str, size: int):
        super().__init__(f"{name} is {size} bytes, over the {RECORD_MAX >> 20} MiB a record has at most")
