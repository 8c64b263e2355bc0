"""Refusals of seats: one per site internally, and the strict-mode error that lists them all."""

from __future__ import annotations

from frt.resolver.resolution import KernelUnavailable


class SiteRefused(Exception):
    """One site cannot be seated; ``str(e)`` is the reason recorded in ``Handle.notes["refused"]``."""


class SeatsRefused(KernelUnavailable):
    """``attach(..., strict=True)`` with sites that could not be seated.

    A `KernelUnavailable` (so a ``ValueError``), like every refusal of this project, but it carries
    many sites rather than one resolver `Refusal`: ``refused`` is ``[(site, reason), ...]``, and
    ``refusal`` is None. Nothing is attached when it is raised.
    """

    def __init__(self, refused: list[tuple[str, str]]):
        # KernelUnavailable.__init__ takes one resolver Refusal; this error lists sites instead.
        lines = "; ".join(f"{site}: {reason}" for site, reason in refused)
        Exception.__init__(self, f"{len(refused)} site(s) refused: {lines}")
        self.refused = list(refused)
        # The base types it Refusal; this error deliberately has none (see the docstring).
        self.refusal = None  # type: ignore[assignment]
