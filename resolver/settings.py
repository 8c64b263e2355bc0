"""Settings read from the environment (FRT_RETRY_*, FRT_RATE_LIMIT_MAX_WAIT, FRT_LEDGER_*, FRT_SERVE_*):
checked where read, so a malformed value is one line of bad input, not a traceback."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import TypeVar, overload

from .errors import BadInput

# Seconds or counts, all of them: past this a value is a typo (1e400 is inf; 99999999999999999999 s
# overflows the C timeouts it is handed to: sqlite's busy timeout, socket timeouts, call_later).
MAX_SETTING = 10**9


N = TypeVar("N", bound=float)  # int or float: what `kind` makes of the text


@overload
def env_number(name: str, default: float, *, low: float = 0, high: float = MAX_SETTING) -> float: ...
@overload
def env_number(name: str, default: N, kind: Callable[[str], N], low: float = 0, high: float = MAX_SETTING) -> N: ...
def env_number(
    name: str, default: float, kind: Callable[[str], float] = float, low: float = 0, high: float = MAX_SETTING
) -> float:
    """A numeric setting from the environment, finite and within [low, high]; else one line of bad
    input naming the variable and what it takes."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = kind(raw)
    except ValueError:
        raise BadInput(f"{name}={raw!r} is not a{'n integer' if kind is int else ' number'}") from None
    if kind is float and not math.isfinite(value):  # inf, nan (an int has neither)
        raise BadInput(f"{name}={raw!r} is not a finite number")
    if value < low:
        raise BadInput(f"{name}={raw!r} must not be negative" if low == 0 else f"{name}={raw!r} must be at least {low}")
    if value > high:
        raise BadInput(f"{name}={raw!r} is out of range (at most {high})")
    return value
