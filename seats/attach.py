"""``attach(model, catalog)``: plan every site without touching the model, then swap all or nothing.

Planning a site: the module fits its kind; the catalog's guards admit the module as it is; the kernel
resolves for this host from the ledger and is staged (never fetched); its variant can run on the
module's device (backend, CUDA archs); the layer or function exists with the right signature; parity
holds on a probe. Any of these failing refuses that site with a reason, and the others go on. Only
then are modules swapped; an exception while swapping puts back everything already swapped.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch

from frt.manifests import DEFAULT_BAND, SeatCatalog
from frt.mirror.home_path import default_home
from frt.resolver.errors import BadInput
from frt.resolver.ledger import Ledger

from .band import MoeSeat
from .calls import kernel_call, slab_bounds
from .checks import device_problem, home_of, module_problem, refuse_if
from .errors import SeatsRefused, SiteRefused
from .guards import build_guard
from .handle import Handle, SeatRecord, restore
from .parity import Parity, check_parity, probe_calls
from .seat import Seat
from .sites import Site, find_sites
from .source import KernelSource, LoadedKernel, open_ledger

log = logging.getLogger("frt.seats")


@dataclass(frozen=True)
class _Plan:
    site: Site
    kernel: LoadedKernel
    seat: Seat
    parity: Parity | None
    slabs: int


def attach(
    model: torch.nn.Module,
    catalog: SeatCatalog,
    *,
    strict: bool = False,
    home: str | Path | None = None,
    ledger: Ledger | None = None,
    environ: Mapping[str, str] | None = None,
) -> Handle:
    """Seat the catalog's kernels into ``model``; return a `Handle` (``detach()`` undoes it).

    ``home``: the mirror home whose staged views hold the kernels (default: ``ledger``'s directory,
    else ``$FRT_MIRROR_HOME``, else the platform's). ``environ``: where ``FRT_KERNEL_REV_<ID>`` pins
    and ``FRT_MOE_BAND_T`` are read (default ``os.environ``), at attach, not at import.
    ``strict``: raise `SeatsRefused` (a `KernelUnavailable`) if any site is refused, attaching nothing.
    """
    if model.training:
        raise BadInput("attach: the model is in training mode; seats are forward-only: call model.eval() first")
    environ = os.environ if environ is None else environ
    band = _default_band(environ)
    home = (
        Path(home) if home is not None else ledger.path.parent if ledger is not None and ledger.path else default_home()
    )
    led = open_ledger(home) if ledger is None else ledger
    own = led if ledger is None else None  # opened here, so closed here
    try:
        sites, nested, unmatched = find_sites(model, catalog)
        source = KernelSource(home, led, environ)
        plans: list[_Plan] = []
        refused: list[tuple[str, str]] = []
        for site in sites:
            try:
                plans.append(_plan(site, model, source, band))
            except SiteRefused as e:
                refused.append((site.path, str(e)))
    finally:
        if own is not None:
            own.close()
    if strict and (refused or not plans):
        raise SeatsRefused(refused or [("<model>", "no module matched the catalog")])
    handle = Handle(_commit(model, plans), {"refused": refused, "nested": nested, "unmatched": unmatched})
    # One line. A refusal raises it to WARNING, so it shows without any logging setup.
    log.log(logging.WARNING if refused else logging.INFO, handle.line())
    return handle


def _plan(site: Site, model: torch.nn.Module, source: KernelSource, default_band: int) -> _Plan:
    spec, module = site.spec, site.module
    if isinstance(module, Seat):
        raise SiteRefused("already seated by an earlier attach: detach that handle first")
    refuse_if(module_problem(spec.kind, module))
    dtype, device = home_of(module, model)
    guard = build_guard(spec.guards, spec.kind, module, dtype, device)
    kernel = source.get(spec.kernel)
    refuse_if(device_problem(kernel, device))
    # module_problem checked it: an lm_head's weight is a 2-D tensor.
    slabs = (
        slab_bounds(int(cast(torch.Tensor, module.weight).shape[0]), spec.slab_rows) if spec.kind == "lm_head" else []
    )
    call = kernel_call(spec, module, kernel.module, slabs)
    band = spec.band or default_band
    parity = None
    if spec.parity:
        checks = [
            check_parity(call, module, args, dtype, spec.tolerance)
            for args in probe_calls(spec.kind, module, guard.width, dtype, device, band)
        ]
        parity = max(checks, key=lambda c: c.error)
    if spec.kind == "moe_experts":
        seat: Seat = MoeSeat(module, call, guard, site.path, band)
    else:
        seat = Seat(module, call, guard, site.path, spec.kind)
    return _Plan(site, kernel, seat, parity, len(slabs))


def _commit(model: torch.nn.Module, plans: list[_Plan]) -> list[SeatRecord]:
    done: list[SeatRecord] = []
    try:
        for p in plans:
            parent = model.get_submodule(p.site.parent_path)
            res, spec = p.kernel.resolution, p.site.spec
            record = SeatRecord(
                p.site.path,
                spec.kind,
                spec.kernel.label,
                res.commit,
                res.variant,
                parent,
                p.site.attr,
                p.site.module,
                p.seat,
                p.parity,
                p.slabs,
            )
            # Recorded before it is swapped in: nothing can come between the swap and `done`, which is
            # what restore (and detach) undo.
            setattr(parent, p.site.attr, p.seat)
            done.append(record)
            if isinstance(p.seat, MoeSeat):
                p.seat.register()
    except BaseException:
        restore(done)  # all or nothing: no half-seated model survives an error
        raise
    return done


def _default_band(environ: Mapping[str, str]) -> int:
    text = environ.get("FRT_MOE_BAND_T")
    if text is None or text == "":
        return DEFAULT_BAND
    if not text.isdigit() or int(text) <= 0:
        raise BadInput(f"FRT_MOE_BAND_T={text!r}: expected a positive row count (default {DEFAULT_BAND})")
    return int(text)
