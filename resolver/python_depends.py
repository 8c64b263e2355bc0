"""The Python packages a variant's `python-depends` stand for, by kernels' own curated list.

kernels 0.17 checks them when it loads a variant (`kernels.python_deps.validate_dependencies`): each
name must be in its `python_depends.json`, generally or for the device's backend, and each of the
packages it names must be importable, or the load raises. So a cluster without the internet needs
those packages' wheels beside the kernel; which packages is kernels' list's answer, read here (the one
module that reads it) rather than copied.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.utils import canonicalize_name

from .errors import FrtError


class UnsupportedDependency(FrtError):
    """A `python-depends` name kernels' list does not know: kernels refuses to load the variant."""


@dataclass(frozen=True)
class PythonPackage:
    project: str  # the name pip installs, canonical (PEP 503)
    import_name: str | None  # what kernels checks is importable; None: a package with no Python module


def packages_for(depends: tuple[str, ...] | list[str], backend: str) -> tuple[PythonPackage, ...]:
    """The packages `depends` need on `backend` (a kernels backend name: cuda, rocm, cpu, …), in order,
    each once; a name kernels' list lacks is UnsupportedDependency, worded as kernels words it."""
    from kernels.python_deps import _DEPENDENCY_DATA as data

    out: dict[str, PythonPackage] = {}
    for dep in depends:
        info = data.general.get(dep) or data.backends.get(backend, {}).get(dep)
        if info is None:
            raise UnsupportedDependency(
                f"uses unsupported kernel dependency: {dep} (kernels' python_depends.json "
                f"has no such name for backend {backend!r})"
            )
        for p in info.python:
            name = canonicalize_name(p.pkg)
            out.setdefault(name, PythonPackage(name, p.import_name))
    return tuple(out.values())
