"""Repo ids and the pin variable derived from them."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from .errors import BadInput

# The Hub's own rule: `org/name`, each part of letters, digits, '-', '_', '.', not
# starting or ending with '-'/'.', no '--' or '..', at most 96 characters.
_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
_REPO_RE = re.compile(rf"{_PART}/{_PART}")


def check_repo_id(repo_id: str) -> str:
    """Return `repo_id` if it is a well-formed ``org/name``, else raise `BadInput`."""
    if not _REPO_RE.fullmatch(repo_id) or "--" in repo_id or ".." in repo_id:
        raise BadInput(f"malformed repo id {repo_id!r}: expected <org>/<name>, e.g. kernels-community/activation")
    return repo_id


def pin_variable(repo_id: str) -> str:
    """``kernels-community/activation`` → ``FRT_KERNEL_REV_KERNELS_COMMUNITY_ACTIVATION``."""
    return "FRT_KERNEL_REV_" + re.sub(r"[^A-Za-z0-9]+", "_", repo_id).upper()


def pinned_revision(repo_id: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The revision a user pinned for `repo_id` in the environment, if any."""
    value = (os.environ if environ is None else environ).get(pin_variable(repo_id), "").strip()
    return value or None
