"""Runs cut off from the world: no network at all (`unshare -n`: no route anywhere, HF_HUB_OFFLINE=1),
and a home on a read-only bind mount (`unshare -m`), as a cluster often has it."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.cli import cli_env

NO_NET = ["unshare", "-n"]


def load_offline(code: str, env: dict) -> subprocess.CompletedProcess:
    """Run `code` with no network at all and HF_HUB_OFFLINE=1: any request would fail, not pass."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "LOCAL_KERNELS", "FRT_"))}
    return subprocess.run(
        [*NO_NET, sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env={**base, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore", **env},
        timeout=120,
    )


def read_only(
    src: Path, ro: Path, script: str, *, net: bool = False, env: dict | None = None, popen: bool = False, **kw
):
    """Run the sh `script` with `ro` a read-only bind mount of `src`, in a mount namespace of its own
    (and, unless `net`, a network namespace with no route)."""
    mount = (
        f"mount --bind {shlex.quote(str(src))} {shlex.quote(str(ro))} && "
        f"mount -o remount,bind,ro {shlex.quote(str(ro))} && "
    )
    cmd = ["unshare", "-m", *([] if net else ["-n"]), "sh", "-c", mount + script]
    if popen:
        return subprocess.Popen(cmd, env=env or cli_env(), **kw)
    return subprocess.run(cmd, capture_output=True, text=True, env=env or cli_env(), timeout=120, **kw)
