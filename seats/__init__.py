"""frt.seats — bind resolved, architecture-checked kernels into a model, and take them out again.

    from frt.manifests import load_seat_catalog
    from frt.seats import attach

    handle = attach(model.eval(), load_seat_catalog("seats-qwen3.toml"), home="/srv/frt-mirror")
    ...                      # [frt.seats] 144 seats (5 head slabs), 0 refused
    handle.summary()         # seats, guarded calls, fallbacks, band counters, clean
    handle.notes["refused"]  # [(site, reason), ...]
    handle.detach()          # the same module objects back: bit-identical outputs

Kernels come only from what `frt-mirror stage` put under the home, resolved for this host by
`frt.resolver` from the ledger; nothing is downloaded. This is the one part of frt-mirror that
needs torch (the ``seats`` extra).

Done: pure-torch kernels on CPU (noarch ``torch-cpu``/``torch-universal`` variants), every kind of
the catalog, guards, parity, the MoE band as a custom op, ``torch.compile``.
TODO(issue 6, GPU slice): Triton ``torch-cuda`` kernels and their H200 runs; a compiled CPU arch
variant built with ``torch.utils.cpp_extension``; ROCm arch checks (gcnArchName) — only CUDA
``backend.archs`` are checked against the module's device today.
"""

from frt.manifests import Guards, KernelRef, SeatCatalog, SeatSpec, load_seat_catalog

from .attach import attach
from .band import MoeSeat
from .checks import arch_problem, rocm_arch_problem
from .errors import SeatsRefused
from .guards import Guard
from .handle import Handle, SeatRecord
from .parity import DEFAULT_TOLERANCE
from .seat import Seat

__all__ = ["DEFAULT_TOLERANCE", "Guard", "Guards", "Handle", "KernelRef", "MoeSeat", "Seat", "SeatCatalog",
           "SeatRecord", "SeatSpec", "SeatsRefused", "arch_problem", "attach", "load_seat_catalog",
           "rocm_arch_problem"]
