"""Upstream -> store: resolve a manifest's kernels for its targets (kernels), fetch exactly the chosen
variants' files through the Hub's transport (transport, fetch), check them against the publisher's own
digest (publisher), stage their wheels and the manifest's models (wheels, models), and draw progress.

May import: store, and the flat modules of frt.mirror.
"""
