"""The adapters without an install: one directory to put on ``PYTHONPATH`` in the engine's environment.

vLLM and SGLang find their plugins with ``importlib.metadata.entry_points()``, which reads every
``*.dist-info/entry_points.txt`` on ``sys.path``, not only those pip wrote. So a directory holding

    frt/                                   the frt package, laid out as a wheel installs it
    frt_mirror_adapters-<v>.dist-info/     METADATA + entry_points.txt (the engine plugins)

works on a cluster that mounts the mirror read-only and may not pip-install into the engine's
environment; spawned workers inherit ``PYTHONPATH`` and load the plugin like an installed one.
The engine's environment still needs frt's own dependencies (kernels, SQLAlchemy, ...).

The distribution is named ``frt-mirror-adapters``, not ``frt-mirror``: were it named like the real
distribution, it would shadow an installed frt-mirror's metadata (version, requirements).
Both may declare the same entry point name: vLLM keys plugins by name, and `register` is idempotent.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

DIST_NAME = "frt_mirror_adapters"
PLUGIN_NAME = "frt"  # the entry point name, which VLLM_PLUGINS / SGLANG_PLUGINS allow-list
ENTRY_POINTS = {
    "vllm.general_plugins": "frt.adapters.vllm_engine:register",
    "sglang.srt.plugins": "frt.adapters.sglang_engine:register",
}
SUBPACKAGES = ("cli", "resolver", "mirror", "seats", "adapters", "manifests")


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("frt-mirror")
    except PackageNotFoundError:  # frt itself runs from such a directory: no installed metadata
        return "0.1.0"


def entry_points_text() -> str:
    return "".join(f"[{group}]\n{PLUGIN_NAME} = {target}\n\n" for group, target in ENTRY_POINTS.items())


def write_dist_info(directory: Path) -> Path:
    """Write ``<directory>/frt_mirror_adapters-<v>.dist-info`` (METADATA, entry_points.txt) and return it."""
    v = version()
    info = directory / f"{DIST_NAME}-{v}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: frt-mirror-adapters\nVersion: {v}\n"
        "Summary: frt-mirror's engine plugins (vLLM, SGLang), from PYTHONPATH\n"
    )
    (info / "entry_points.txt").write_text(entry_points_text())
    (info / "top_level.txt").write_text("frt\n")
    return info


def package_dirs() -> dict[str, Path]:
    """Where each part of ``frt`` lives now (``frt`` and its subpackages), without importing them:
    ``frt.seats`` imports torch, which the connected box writing this directory may not have."""
    dirs = {"frt": _package_dir("frt")}
    for sub in SUBPACKAGES:
        dirs[f"frt.{sub}"] = _package_dir(f"frt.{sub}")
    return dirs


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin is not None, name  # each part of frt is a regular package
    return Path(spec.origin).parent


def write_python_dir(directory: Path) -> Path:
    """(Re)write ``directory`` with the frt package and the dist-info; atomic per call: it is built
    beside the target and swapped in, so an engine starting meanwhile never sees half of it."""
    directory = Path(directory).absolute()
    directory.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}."))
    try:
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
        for name, src in package_dirs().items():
            dest = build.joinpath(*name.split("."))
            if name == "frt":  # the root's own modules (its __init__); its subpackages come one by one
                dest.mkdir(parents=True)
                for module in src.glob("*.py"):
                    shutil.copy2(module, dest / module.name)
            else:
                shutil.copytree(src, dest, ignore=ignore)
        write_dist_info(build)
        os.chmod(build, 0o755)  # mkdtemp makes it 0700; engines may run as another user
        if directory.exists():
            old = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}.old."))
            os.replace(directory, old / directory.name)
            os.replace(build, directory)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(build, directory)
    finally:
        shutil.rmtree(build, ignore_errors=True)
    return directory
