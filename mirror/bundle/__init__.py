"""bundle / import: carry a staged set across an air gap in one self-describing tar.

The archive and its manifest: frt.mirror.bundle.format. Writing (full, or incremental with `since`,
signed with `sign`): frt.mirror.bundle.write. Importing, which verifies everything before it writes
anything: frt.mirror.bundle.read, over the manifest's checks (check) and an incremental
bundle's base (state), merging its repos as a rebuild does (merge). Keys and signatures:
frt.mirror.bundle.signing.

May import: store, stage (its progress meter), and the flat modules of frt.mirror.
"""

from __future__ import annotations

from .format import FORMAT, MANIFEST, READS, SIGNATURE, BundleRejected, BundleReport, bundle_id
from .read import import_bundle
from .write import bundle

__all__ = [
    "FORMAT",
    "MANIFEST",
    "READS",
    "SIGNATURE",
    "BundleRejected",
    "BundleReport",
    "bundle",
    "bundle_id",
    "import_bundle",
]
