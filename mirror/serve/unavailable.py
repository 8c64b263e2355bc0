"""How pull-through says the upstream could not give it something: 503 (come back) or 502 (its fault).

- **503 with Retry-After**: the upstream could not be asked, or not in time: it refuses connections
  (central stopped, a restart), keeps failing after the retries (5xx, cut connections), is slow past
  --upstream-timeout, or holds this mirror in a rate-limit window. Nothing is wrong with what the client
  asked for, and the same request may work shortly; a refused connection is answered at once (serve's
  retry policy does not retry it), never after the hold.
- **502**: the upstream answered, and its answer is wrong: bytes that fail verification, a file its own
  listing names that it will not send, an answer that is not the Hub's (UpstreamMalformed). Asking again
  at once gets the same answer, so no Retry-After is promised.

Retry-After: the seconds until the upstream's spent rate-limit window resets, where the mirror waits for
one (the pacer knows); else --upstream-timeout (5 s by default), the time the mirror gives one upstream
answer. The mirror itself asks again on the first request after RETRY_FAILED_S (pull.py), so a client
that comes back when told finds a fresh try, never a failure kept for the refs TTL. What
huggingface_hub does with it: docs/operating.md ("When the upstream is down").
"""

from __future__ import annotations

import math

from frt.resolver.errors import BadInput, FrtError, UpstreamMalformed, UpstreamUnavailable, VerificationFailed

from ..stage.fetch import ListedFileRefused
from .protocol import HubError


def retry_after(window: float, timeout: float) -> str:
    """Retry-After in whole seconds (at least 1): the rate-limit window's rest when one is spent (`window`
    > 0), else the upstream timeout."""
    return str(max(1, math.ceil(window if window > 0 else timeout)))


def upstream_error(e: FrtError, where: str, come_back: str) -> HubError:
    """A pull that failed, as the client sees it: nothing was stored, and the next request tries again.
    `come_back`: the Retry-After of a 503 (retry_after)."""
    if isinstance(e, ListedFileRefused):  # no bytes came: the upstream contradicts its listing
        return HubError(502, None, f"{where}: nothing was stored: {e}")
    if isinstance(e, VerificationFailed):
        return HubError(502, None, f"{where}: the upstream's bytes failed verification and were not stored: {e}")
    if isinstance(e, UpstreamMalformed):
        return HubError(502, None, f"{where}: the upstream's answer was refused, nothing was stored: {e}")
    if isinstance(e, UpstreamUnavailable):
        return HubError(
            503,
            None,
            f"{where}: the upstream is unavailable, nothing was stored: {e}: try again shortly",
            {"Retry-After": come_back},
        )
    if isinstance(e, BadInput):
        return HubError(404, "EntryNotFound", str(e))
    return HubError(502, None, f"{where}: {e}")


def not_askable(repo_id: str, stale: str, fault: bool, come_back: str) -> HubError:
    """A repo the mirror has nothing of while its upstream cannot be asked: not "does not exist" (a 404
    a client would believe). `fault`: the upstream's last answer was refused as malformed (502)."""
    said = f"{repo_id} is not on this mirror, and its upstream cannot be asked ({stale})"
    if fault:
        return HubError(502, None, said)
    return HubError(503, None, f"{said}: try again shortly", {"Retry-After": come_back})


def on_its_way(what: str, window: float, timeout: float) -> HubError:
    """A 503 for what the upstream has not answered yet (slow, or a rate-limit window the mirror waits
    out), saying when to come back."""
    why = (
        f"the upstream is rate-limiting this mirror for {window:.0f} s more"
        if window > 0
        else f"the upstream did not answer within {timeout:g} s"
    )
    return HubError(
        503,
        None,
        f"{what} is on its way from the upstream ({why}): try again shortly",
        {"Retry-After": retry_after(window, timeout)},
    )
