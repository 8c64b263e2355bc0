"""Debian's chromium, headless, as the page tests and the demand loop drive it (.ci/run installs it)."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import pytest


def chromium(tmp: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Headless chromium, as CI runs it: as root (so --no-sandbox), a private profile, no proxy."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.fail("these tests need Debian's chromium (apt-get install chromium; .ci/run installs it)", pytrace=False)
    profile = tmp / f"chromium-profile-{len(list(tmp.glob('chromium-profile-*')))}"
    return subprocess.run(
        [
            exe,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--no-proxy-server",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def dump_dom(tmp: Path, url: str) -> str:
    p = chromium(tmp, "--dump-dom", url)
    assert p.returncode == 0 and "</html>" in p.stdout, p.stderr[-2000:]
    return p.stdout


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])
