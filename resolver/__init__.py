"""frt.resolver — targets and variants, the Hub client, the SQLite ledger, resolve and pins.

Needs no torch: a connected box that stages kernels for a cluster may have none. Its names are
imported from their submodules on first use (frt/lazy.py): a light one does not bring the heavy ones.
"""

from frt.lazy import lazy_exports

__all__ = lazy_exports(__name__, {
    "errors": ("BadInput", "FrtError", "KernelUnavailable", "LedgerCorrupt", "UpstreamUnavailable", "exit_code"),
    "hub": ("HubClient", "RetryPolicy"),
    "ledger": ("Ledger",),
    "matrix": ("Matrix", "build_matrix"),
    "gate": ("check_repo_id",),
    "repo_ids": ("pin_variable", "pinned_revision"),
    "resolution": ("FileEntry", "Refusal", "Request", "Resolution"),
    "resolve": ("make_request", "refresh_and_decide", "resolve"),
    "scan": ("ScanReport", "scan"),
    "targets": ("Target", "host_target", "make_target", "parse_target"),
    "variants": ("VariantDecision", "accepted", "decide"),
})
