"""Settings read from the environment (FRT_RETRY_*, FRT_RATE_LIMIT_MAX_WAIT): checked where read, so a
malformed value is one line of bad input, not a traceback."""

from __future__ import annotations

import os

from .errors import BadInput


def env_number(name: str, default, kind=float):
    """A numeric setting from the environment; a malformed one is one line of bad input."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = kind(raw)
    except ValueError:
        raise BadInput(f"{name}={raw!r} is not a{'n integer' if kind is int else ' number'}") from None
    if value < 0:
        raise BadInput(f"{name}={raw!r} must not be negative")
    return value
