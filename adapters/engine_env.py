"""What an engine job sets so that its workers attach seats without installing anything: PYTHONPATH
(the frt package and the plugins' dist-info), FRT_MIRROR_HOME, FRT_SEATS and the plugin allow-list."""

from __future__ import annotations

from pathlib import Path

from frt.resolver.errors import BadInput

ENGINES = ("vllm", "sglang")


def engine_vars(engine: str, python_dir: Path, home: Path, seats: Path | None = None) -> dict[str, str]:
    """What an engine job sets so that its workers attach ``seats`` with kernels from ``home``.

    ``python_dir`` (written by `frt.adapters.distinfo.write_python_dir`) holds the frt package and the
    dist-info that declares the engine plugin. ``VLLM_PLUGINS`` / ``SGLANG_PLUGINS`` are allow-lists of
    plugin names: a cluster that uses other plugins adds them, comma-separated. vLLM's compile cache
    is off because its key does not cover the seats (see `frt.adapters.vllm_engine`).
    """
    from .distinfo import PLUGIN_NAME

    if engine not in ENGINES:
        raise BadInput(f"unknown engine {engine!r}: expected one of {', '.join(ENGINES)}")
    if ":" in str(python_dir):
        raise BadInput(f"python dir {python_dir} contains ':', which PYTHONPATH cannot carry")
    values = {"PYTHONPATH": str(python_dir), "FRT_MIRROR_HOME": str(home)}
    if seats is not None:
        values["FRT_SEATS"] = str(seats)
    if engine == "vllm":
        values.update(VLLM_PLUGINS=PLUGIN_NAME, VLLM_DISABLE_COMPILE_CACHE="1")
    else:
        values.update(SGLANG_PLUGINS=PLUGIN_NAME)
    return values


def check_catalog(path: Path) -> Path:
    """The catalog an engine will read, checked here, where a typo is cheap to fix."""
    from frt.manifests import ManifestError, load_seat_catalog

    try:
        load_seat_catalog(path)
    except ManifestError as e:
        raise BadInput(str(e)) from None
    return path.absolute()
