"""A package whose exports are imported on first use (PEP 562), so that importing one light submodule
(``frt.resolver.errors``), or running ``frt-mirror --help``, does not import every heavy one
(SQLAlchemy, huggingface_hub, kernels, Starlette): the CLI's start-up was ~1 s before any command ran.

``from frt.resolver import Ledger`` works as before; the submodule is imported then. Where an export
shares its name with the submodule it comes from (``resolve`` in resolve.py), the package's name stays
the function, as an eager ``from .resolve import resolve`` left it: the import system binds each
submodule on its package once it is loaded, and the package's class turns that binding into the export.
"""

from __future__ import annotations

import importlib
import sys
import types


class _LazyPackage(types.ModuleType):
    def __setattr__(self, name: str, value) -> None:
        where = self.__dict__.get("_lazy_where", {})
        if isinstance(value, types.ModuleType) and where.get(name) == name and value.__name__ == f"{self.__name__}.{name}":
            value = getattr(value, name)
        super().__setattr__(name, value)


def lazy_exports(package: str, exports: dict[str, tuple[str, ...]]) -> list[str]:
    """Make `package` (already in sys.modules: call it from the package's own __init__) import each
    name of ``exports`` (submodule -> names) from its submodule when first asked for; return the
    names, for ``__all__``."""
    module = sys.modules[package]
    where = {name: sub for sub, names in exports.items() for name in names}

    def __getattr__(name: str):
        sub = where.get(name)
        if sub is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{sub}"), name)
        setattr(module, name, value)
        return value

    module.__dict__["_lazy_where"] = where
    module.__getattr__ = __getattr__
    module.__class__ = _LazyPackage
    return sorted(where)
