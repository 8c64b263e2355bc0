"""The wheel of this checkout, built as a pip install builds it: what a user of frt-mirror gets."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support import ROOT


def pip_wheel(out: Path) -> subprocess.CompletedProcess:
    """`pip wheel` of the checkout into `out` (no dependencies, no build isolation); the caller checks
    the result and finds `frt_mirror-*.whl` in `out`."""
    args = ["-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(ROOT)]
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300)
