"""frt.resolver — targets and variants, the Hub client, the SQLite ledger, resolve and pins.

Needs no torch: a connected box that stages kernels for a cluster may have none.
"""

from .errors import BadInput, FrtError, KernelUnavailable, LedgerCorrupt, UpstreamUnavailable, exit_code
from .hub import HubClient, RetryPolicy
from .ledger import Ledger
from .matrix import Matrix, build_matrix
from .gate import check_repo_id
from .repo_ids import pin_variable, pinned_revision
from .resolution import FileEntry, Refusal, Request, Resolution
from .resolve import make_request, refresh_and_decide, resolve
from .scan import ScanReport, scan
from .targets import Target, host_target, make_target, parse_target
from .variants import VariantDecision, accepted, decide

__all__ = [
    "BadInput", "FileEntry", "FrtError", "HubClient", "KernelUnavailable", "Ledger", "LedgerCorrupt", "Matrix",
    "Refusal", "Request", "Resolution", "RetryPolicy", "ScanReport", "Target", "UpstreamUnavailable",
    "VariantDecision", "accepted", "build_matrix", "check_repo_id", "decide", "exit_code", "host_target",
    "make_request", "make_target", "parse_target", "pin_variable", "pinned_revision", "refresh_and_decide",
    "resolve", "scan",
]
