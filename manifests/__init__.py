"""frt.manifests — parse what ``frt-mirror stage [MANIFEST]`` accepts into one shape.

Three inputs (see ``examples/``): the frt manifest TOML (``[[targets]]``, ``[kernels]``,
``[trust]``), a project's ``pyproject.toml`` (``[tool.kernels.dependencies]``, optionally
``[tool.frt-mirror]`` for targets and trust), and a kernels >= 0.17 ``kernels.lock``.

Stdlib only, on purpose: nothing here imports frt.resolver, kernels or huggingface_hub. Target
strings and backends are kept as written; the resolver validates them (``TargetSpec.source``
gives it the ``file:line`` to blame).

Also the seat catalog (``seats.py``, ``examples/seats-*.toml``): which module positions of a model
``frt.seats.attach`` binds to which kernel, under which guards.
"""

from pathlib import Path

from .load import DIR_ORDER, load_manifest
from .model import KernelSpec, Manifest, ManifestError, ModelSpec, TargetSpec, Trust
from .seats import (
    DEFAULT_BAND,
    KINDS,
    Guards,
    KernelRef,
    SeatCatalog,
    SeatSpec,
    SeatSpecError,
    load_seat_catalog,
    parse_seat_catalog,
)

#: The shipped, commented example manifests (cluster.toml, pyproject-example.toml, kernels.lock).
EXAMPLES = Path(__file__).resolve().parent / "examples"

__all__ = [
    "DEFAULT_BAND",
    "DIR_ORDER",
    "EXAMPLES",
    "KINDS",
    "Guards",
    "KernelRef",
    "KernelSpec",
    "Manifest",
    "ModelSpec",
    "ManifestError",
    "SeatCatalog",
    "SeatSpec",
    "SeatSpecError",
    "TargetSpec",
    "Trust",
    "load_manifest",
    "load_seat_catalog",
    "parse_seat_catalog",
]
