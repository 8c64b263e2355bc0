"""`--target host` on a job's start, remembered: detecting this machine as kernels does imports torch
(seconds), and a cluster's launcher runs `frt-mirror env --target host` on every job. The detection is
targets.host_target, unchanged; its answer is kept per interpreter, machine and installed packages, in
the user's cache folder, and detected again whenever any of them changes.

What the answer depends on, and so the key: the interpreter (its path and version), the machine (name,
platform, macOS release: Metal is asked of the hardware), TORCH_DEVICE_BACKEND_AUTOLOAD (torch_tpu and
the Neuron extension announce themselves through that autoload), and what is installed: the modification
time of every folder on sys.path (installing, upgrading or removing a distribution adds or removes an
entry there) and of torch's version.py. A cache that cannot be read or written is detection every time.

The file is in marshal's format, as the interpreter's own bytecode caches are: built in and loaded already
(json's modules cost `env --target host` over a millisecond of its start-up), and the file is this
interpreter's alone (its key names the interpreter and its version).
"""

from __future__ import annotations

import marshal
import os
import platform
import sys
import zlib
from collections.abc import Callable
from pathlib import Path

from .fs import atomic_write

# Bumped when what is kept changes shape.
_FORMAT = 2


def remembered_host(detect: Callable[[], dict[str, object]], torch_dir: Path) -> dict[str, object]:
    """`detect()`'s answer for this machine as it is now (a dict of strings, booleans and None: targets.py
    turns a Target into one and back), from the cache where it holds one. `torch_dir`: where torch is
    installed."""
    key = _key(torch_dir)
    # One file per interpreter and machine (named by a checksum: no hash library to import on a job's
    # start), holding the whole key, compared on read: an install that changed rewrites it in place.
    where = "\0".join([sys.executable, platform.node()])
    path = cache_dir() / "host-targets" / f"{zlib.crc32(where.encode()):08x}.marshal"
    try:
        doc = marshal.loads(path.read_bytes())
        if isinstance(doc, dict) and doc.pop("key", None) == key:
            return doc
    except (OSError, ValueError, EOFError, TypeError):  # what marshal raises on a damaged file
        pass
    target = detect()
    try:
        atomic_write(path, marshal.dumps({"key": key, **target}))  # a reader meanwhile detects for itself
    except OSError:
        pass  # a read-only home folder (a cluster's): detection every time, as before the cache
    return target


def cache_dir() -> Path:
    """The user's cache folder for frt-mirror (XDG_CACHE_HOME on Linux)."""
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "frt-mirror"
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local")) / "frt-mirror" / "Cache"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "frt-mirror"


def _key(torch_dir: Path) -> str:
    parts: list[object] = [
        _FORMAT,
        sys.executable,
        sys.version,
        # os.uname, not platform's: platform.uname().processor runs `uname -p`, and platform.platform() reads
        # the interpreter's binary for its libc
        tuple(os.uname()) if hasattr(os, "uname") else tuple(platform.uname())[:5],
        platform.mac_ver()[0],
        os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD"),
    ]
    for entry in [*sys.path, str(torch_dir / "version.py")]:
        try:
            parts.append((entry, os.stat(entry or ".").st_mtime_ns))
        except OSError:
            parts.append((entry, None))
    return repr(parts)
