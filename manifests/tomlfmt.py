"""The two TOML inputs: the frt manifest, and a project's pyproject.toml."""

from __future__ import annotations

from typing import Any

from .fields import check_version, parse_kernels, parse_models, parse_targets, parse_trust, repo_id_problem
from .model import KernelSpec, Manifest, TargetSpec, Trust
from .source import Source, ValuePath

_FRT_KEYS = ("targets", "kernels", "models", "trust")
_TOOL_KEYS = ("targets", "trust")  # [tool.frt-mirror]: kernels come from [tool.kernels.dependencies]


def parse_frt(src: Source, data: dict[str, Any]) -> Manifest:
    """``[[targets]]`` (optional: the caller may pass --target), ``[kernels]``, ``[models]`` (at least
    one of the two), ``[trust]``."""
    for key in data:
        if key not in _FRT_KEYS:
            raise src.error((key,), f"unknown top-level key; expected {', '.join(_FRT_KEYS)}")
    if "kernels" not in data and "models" not in data:
        raise src.error((), 'missing: add a [kernels] table, "org/name" = { version = 1 }', missing="kernels")
    targets = parse_targets(src, data["targets"], ("targets",)) if "targets" in data else ()
    kernels = parse_kernels(src, data["kernels"], ("kernels",)) if "kernels" in data else ()
    models = parse_models(src, data["models"], ("models",)) if "models" in data else ()
    trust = parse_trust(src, data["trust"], ("trust",)) if "trust" in data else Trust()
    return Manifest(src.path, "frt", targets, kernels, trust, models)


def parse_pyproject(src: Source, data: dict[str, Any]) -> Manifest:
    """``[tool.kernels.dependencies]`` as ``kernels lock`` reads it (``"org/name" = <int version>``),
    plus an optional ``[tool.frt-mirror]`` with ``targets`` and ``trust`` in the frt shapes."""
    tool = data.get("tool")
    kern = tool.get("kernels") if isinstance(tool, dict) else None
    if not isinstance(tool, dict) or not isinstance(kern, dict) or "dependencies" not in kern:
        # Point at [tool.kernels] when it exists; otherwise there is no line to point at (the
        # nearest-match search would land on an unrelated [tool.x] header).
        line = src.line(("tool", "kernels")) if isinstance(kern, dict) else None
        raise src.error(
            ("tool", "kernels"),
            'missing: add [tool.kernels.dependencies] with "org/name" = 1',
            missing="dependencies",
            line=line,
        )
    deps_path = ("tool", "kernels", "dependencies")
    deps = kern["dependencies"]
    if not isinstance(deps, dict):
        raise src.error(deps_path, 'must be a table of "org/name" = <version>')
    if not deps:
        raise src.error(deps_path, "is empty: nothing to stage")
    kernels = tuple(_dependency(src, repo, v, deps_path + (repo,)) for repo, v in deps.items())

    targets: tuple[TargetSpec, ...] = ()
    trust = Trust()
    frt = tool.get("frt-mirror")
    if frt is not None:
        path = ("tool", "frt-mirror")
        if not isinstance(frt, dict):
            raise src.error(path, "must be a table with targets and trust")
        for key in frt:
            if key not in _TOOL_KEYS:
                raise src.error(
                    path + (key,),
                    f"unknown key; expected {', '.join(_TOOL_KEYS)} (kernels go in [tool.kernels.dependencies])",
                )
        if "targets" in frt:
            targets = parse_targets(src, frt["targets"], path + ("targets",))
        if "trust" in frt:
            trust = parse_trust(src, frt["trust"], path + ("trust",))
    return Manifest(src.path, "pyproject", targets, kernels, trust)


def _dependency(src: Source, repo: str, value: object, path: ValuePath) -> KernelSpec:
    problem = repo_id_problem(repo)
    if problem:
        raise src.error(path, problem)
    # kernels' own `kernels lock` takes only int versions here (KernelVersion.Version(value)), so
    # the frt inline-table form would work with us but break `kernels lock`: refuse it.
    if isinstance(value, dict):
        raise src.error(
            path,
            f'must be an integer version, as `kernels lock` expects: "{repo}" = 1 '
            "(revisions go in an frt manifest or kernels.lock)",
        )
    return KernelSpec(repo, version=check_version(src, value, path), source=src.at(path))
