"""bundle / import: carry a staged set across an air gap in one self-describing tar.

The archive and its manifest: frt.mirror.bundle_format. Writing (full, or incremental with `since`,
signed with `sign`): frt.mirror.bundle_write. Importing, which verifies everything before it writes
anything: frt.mirror.bundle_read, over the manifest's checks (bundle_check) and an incremental
bundle's base (bundle_state). Keys and signatures: frt.mirror.signing.
"""

from __future__ import annotations

from .bundle_format import FORMAT, MANIFEST, READS, SIGNATURE, BundleRejected, BundleReport, bundle_id
from .bundle_read import import_bundle
from .bundle_write import bundle

__all__ = ["FORMAT", "MANIFEST", "READS", "SIGNATURE", "BundleRejected", "BundleReport", "bundle", "bundle_id",
           "import_bundle"]
