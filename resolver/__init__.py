"""frt.resolver — targets and variants, the Hub client, the ledger, resolve and pins.

Needs no torch: a connected box that stages kernels for a cluster may have none. The package imports
nothing: each caller imports the submodule it uses (`from frt.resolver.targets import parse_target`),
so a light one (errors, targets) does not bring the heavy ones (SQLAlchemy, huggingface_hub, kernels).
"""
