"""Engine-agnostic part of the adapters: attach the catalog that ``FRT_SEATS`` names to a loaded model.

An engine hook (vLLM's wrapped ``load_model``, SGLang's AFTER hook) calls `attach_from_env(model,
engine=...)` in the worker process, after the weights are loaded and before any compilation or
graph capture. Everything is read from the environment at that moment, because that is the only
thing that reliably reaches a spawned worker:

- ``FRT_SEATS``: path of a seat catalog TOML. Unset or empty: nothing happens (returns None).
- ``FRT_SEATS_STRICT``: ``1``/``true``/``yes`` makes any refused site an error (nothing attached).
- ``FRT_MIRROR_HOME``: the staged mirror the kernels come from (as for ``frt.seats.attach``).
- ``FRT_SEATS_MARKER_DIR``: if set, each attach writes ``<engine>-<pid>.json`` there (what was seated,
  what was refused), so a test or an operator in another process can see what the worker did.

One line is logged on logger ``frt.<engine>``: ``[frt.vllm] N seats (kinds; catalog), M refused``.
Importing this module is cheap (stdlib only): engines import their plugin in every process, used or not.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from frt.resolver.fs import atomic_write

if TYPE_CHECKING:
    import torch

    from frt.seats import Handle

SEATS_VAR, STRICT_VAR, MARKER_VAR, HOME_VAR = "FRT_SEATS", "FRT_SEATS_STRICT", "FRT_SEATS_MARKER_DIR", "FRT_MIRROR_HOME"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")

# The handles attached in this process, per engine, in order. Workers live as long as the engine,
# and so must the handles: they are the only way to read counters or detach.
_HANDLES: dict[str, list[Handle]] = {}


def attach_from_env(model: torch.nn.Module, engine: str, *, environ: Mapping[str, str] | None = None) -> Handle | None:
    """Attach the catalog named by ``FRT_SEATS`` to ``model``; None when ``FRT_SEATS`` is unset.

    Refusals are outcomes (logged, in the handle and the marker), unless ``FRT_SEATS_STRICT`` is on:
    then `frt.seats.SeatsRefused` propagates and the engine fails to start, which is the point of
    strict. A bad ``FRT_SEATS`` path or catalog is a `BadInput` either way: seats were asked for.
    """
    environ = os.environ if environ is None else environ
    path = environ.get(SEATS_VAR, "")
    if not path:
        return None
    from frt.manifests import ManifestError, load_seat_catalog
    from frt.resolver.errors import BadInput
    from frt.seats import attach

    try:
        catalog = load_seat_catalog(path)
    except (OSError, ManifestError) as e:
        raise BadInput(f"{SEATS_VAR}={path}: {e}") from None
    ensure_log_handler()
    home = environ.get(HOME_VAR) or None
    handle = attach(model, catalog, strict=strict_from_env(environ), home=home, environ=environ)
    record(engine, handle, path, environ)
    return handle


def record(engine: str, handle: Handle, catalog: str, environ: Mapping[str, str] | None = None) -> None:
    """Keep ``handle`` for `handles`, log the engine line, and write the marker if asked to."""
    environ = os.environ if environ is None else environ
    _HANDLES.setdefault(engine, []).append(handle)
    level = logging.WARNING if handle.notes["refused"] else logging.INFO
    logging.getLogger(f"frt.{engine}").log(level, engine_line(engine, handle, Path(catalog).name))
    marker_dir = environ.get(MARKER_VAR)
    if marker_dir:
        write_marker(Path(marker_dir), engine, handle, catalog)


def handles(engine: str) -> list[Handle]:
    """The handles `attach_from_env` returned in this process for ``engine`` (oldest first)."""
    return list(_HANDLES.get(engine, ()))


def strict_from_env(environ: Mapping[str, str]) -> bool:
    from frt.resolver.errors import BadInput

    text = environ.get(STRICT_VAR, "").strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise BadInput(f"{STRICT_VAR}={text!r}: expected 1/true/yes or 0/false/no")


def engine_line(engine: str, handle: Handle, catalog_name: str) -> str:
    kinds = Counter(r.kind for r in handle.records)
    parts = [", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "none"]
    if handle.head_slabs:
        parts.append(f"{handle.head_slabs} head slabs")
    parts.append(f"catalog {catalog_name}")
    return f"[frt.{engine}] {len(handle.records)} seats ({'; '.join(parts)}), {len(handle.notes['refused'])} refused"


def marker_record(engine: str, handle: Handle, catalog: str) -> dict[str, object]:
    return {
        "engine": engine,
        "pid": os.getpid(),
        "catalog": str(catalog),
        "seats": [
            {"site": r.site, "kind": r.kind, "kernel": r.kernel, "commit": r.commit, "variant": r.variant}
            for r in handle.records
        ],
        "refused": [list(pair) for pair in handle.notes["refused"]],
        "unmatched": list(handle.notes["unmatched"]),
    }


def write_marker(directory: Path, engine: str, handle: Handle, catalog: str) -> Path:
    """``<directory>/<engine>-<pid>.json``, written atomically: a reader never sees half a file."""
    return atomic_write(
        directory / f"{engine}-{os.getpid()}.json", json.dumps(marker_record(engine, handle, catalog), indent=1)
    )


def ensure_log_handler() -> None:
    """Make ``frt.*`` INFO lines visible in an engine worker that configured no logging for us.

    Engines configure their own logger (``vllm``, ``sglang``), not the root, so without this the
    attach line would be swallowed (Python's last-resort handler shows WARNING and above only).
    Nothing is added when the application configured logging that reaches ``frt``.
    """
    frt = logging.getLogger("frt")
    if frt.hasHandlers():
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s %(message)s", "%m-%d %H:%M:%S"))
    frt.addHandler(handler)
    if frt.level == logging.NOTSET:
        frt.setLevel(logging.INFO)
