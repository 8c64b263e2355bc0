"""A node's GPU archs, carried in its clients' User-Agent to the mirror that counts its demand.

Why: kernels' User-Agent names a node's torch, backend and platform (`backend/cu130; platform/x86_64-linux;
torch/2.11.0`), never its GPUs, so serve's demand (mirror/serve/demand.py) counted a CUDA node's misses as
`torch2.11-cu130-x86_64-linux`, and a `demand manifest` staged variants that may not load on its devices.
huggingface_hub (1.x and 2.x, utils/_headers.py) appends `; origin/<HF_HUB_USER_AGENT_ORIGIN>` to every
User-Agent it builds, kernels' included. So where frt knows a node's archs (`frt-mirror env --target
T@8.0,9.0`), env exports that variable with the token `frt-archs:8.0,9.0`, and serve reads it back.

The token is one word of the origin value; the words a user had there are kept before it (a token of an
earlier `env` is replaced, not stacked). serve takes the token only where its archs are archs of the
target's backend as targets.py parses them (a CUDA capability for cu*, a gfx name for rocm*); anything else
in the origin, or a token it refuses, leaves the target without archs. Like the rest of a User-Agent, it
is what the client says: a hint for demand, never trust.
"""

from __future__ import annotations

import re

from .errors import FrtError
from .targets import Target, with_archs

ENV = "HF_HUB_USER_AGENT_ORIGIN"
TOKEN = "frt-archs:"
_ORIGIN = "; origin/"  # where huggingface_hub puts the variable's value: last in the agent
_WORD = re.compile(r"(?:^|\s)" + re.escape(TOKEN) + r"([^\s;]{1,200})(?=\s|;|$)")


def origin_value(target: Target, theirs: str | None) -> str | None:
    """HF_HUB_USER_AGENT_ORIGIN naming `target`'s archs after the user's own words (`theirs`, the
    variable's value now); None where the target names no archs (nothing to export)."""
    if not target.archs:
        return None
    kept = [w for w in (theirs or "").split() if not w.startswith(TOKEN)]
    return " ".join([*kept, TOKEN + ",".join(target.archs)])


def agent_archs(target: Target, agent: str) -> Target:
    """`target` with the archs a User-Agent's origin names, where they are archs of its backend;
    else `target` as it was."""
    at = agent.rfind(_ORIGIN)
    m = _WORD.search(agent[at + len(_ORIGIN) :]) if at >= 0 else None
    if m is None:
        return target
    try:
        return with_archs(target, m[1].split(","))
    except FrtError:  # BadTargetField: not archs of this backend (a CPU target, '+PTX', junk)
        return target
