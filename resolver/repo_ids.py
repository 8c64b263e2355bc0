"""The pin variable derived from a repo id (the id itself is checked by `gate.check_repo_id`)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping


def pin_variable(repo_id: str) -> str:
    """``kernels-community/activation`` → ``FRT_KERNEL_REV_KERNELS_COMMUNITY_ACTIVATION``."""
    return "FRT_KERNEL_REV_" + re.sub(r"[^A-Za-z0-9]+", "_", repo_id).upper()


def pinned_revision(repo_id: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The revision a user pinned for `repo_id` in the environment, if any."""
    value = (os.environ if environ is None else environ).get(pin_variable(repo_id), "").strip()
    return value or None


def did_you_mean(repo_id: str, known: Iterable[str]) -> str:
    """`: did you mean X?` for a message about `repo_id` that is not there, where a known id is one or two
    characters off (a typo); "" otherwise: advice never names the mistyped id as what to do next."""
    from difflib import get_close_matches

    near = get_close_matches(repo_id, [k for k in known if k != repo_id], n=1, cutoff=0.85)
    return f": did you mean {near[0]}?" if near else ""
