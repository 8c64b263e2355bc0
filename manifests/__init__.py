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

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

# Each name from the submodule that defines it, on first use (PEP 562): the CLI checks a repo id with
# fields.py on every start, and must not load the manifest and seat-catalog parsers to do it.
_FROM = {
    **dict.fromkeys(["DIR_ORDER", "load_manifest"], "load"),
    **dict.fromkeys(["KernelSpec", "Manifest", "ManifestError", "ModelSpec", "TargetSpec", "Trust"], "model"),
    **dict.fromkeys(
        ["DEFAULT_BAND", "KINDS", "Guards", "KernelRef", "SeatCatalog", "SeatSpec", "SeatSpecError"], "seats"
    ),
    **dict.fromkeys(["load_seat_catalog", "parse_seat_catalog"], "seats"),
}


def __getattr__(name: str) -> Any:
    if name not in _FROM:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_FROM[name]}"), name)


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
