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

Tested with pure-torch kernels on CPU (noarch ``torch-cpu``/``torch-universal``), a compiled CPU arch
variant (C++ through ``torch.utils.cpp_extension``), and Triton ``torch-cuda`` kernels on an H200
(tests/test_seats_gpu.py, skipped where there is no CUDA device). CUDA ``backend.archs`` and ROCm
``gcnArchName`` are checked against the module's own device, by the `kernels` library's rules.
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

__all__ = [
    "DEFAULT_TOLERANCE",
    "Guard",
    "Guards",
    "Handle",
    "KernelRef",
    "MoeSeat",
    "Seat",
    "SeatCatalog",
    "SeatRecord",
    "SeatSpec",
    "SeatsRefused",
    "arch_problem",
    "attach",
    "load_seat_catalog",
    "rocm_arch_problem",
]
