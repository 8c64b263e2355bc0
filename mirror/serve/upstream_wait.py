"""Pull-through waiting out the upstream's rate-limit window (resolver/pacing.py's `on_wait`: once per
window, however many requests wait on it): one line in serve's log, and the wait counted on /metrics
(`frt_mirror_upstream_waits_total`, `frt_mirror_upstream_wait_seconds_total`, by bucket). The Hub's
429s and a tier's upstream's (another mirror's quota, or a proxy's before it) are waited for alike."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from frt.resolver.errors import one_line

from .metrics import observe_wait

if TYPE_CHECKING:
    from frt.resolver.pacing import Wait


def on_wait(wait: Wait) -> None:
    """`frt-mirror: pull-through: waiting 2 s for the upstream's api window (10 per 2 s)`."""
    quota = f" ({wait.quota} per {wait.window:g} s)" if wait.quota and wait.window else ""
    print(
        f"frt-mirror: pull-through: waiting {max(1, round(wait.seconds))} s for the upstream's "
        f"{one_line(wait.bucket)} window{quota}",
        file=sys.stderr,
        flush=True,
    )
    observe_wait(wait.bucket, wait.seconds)
