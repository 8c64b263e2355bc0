"""A manifest's text plus the means to turn a value path into ``file:line`` and a ManifestError."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import TypeAlias

from .model import ManifestError

#: A value's path in the file: str keys and int array indices, e.g. ``("targets", 0, "torch")``.
ValuePath: TypeAlias = tuple[str | int, ...]

_BARE = re.compile(r"[A-Za-z0-9_-]+")


def field_name(path: ValuePath) -> str:
    """Render a value path the way a user would write it: ``targets[1].torch``,
    ``kernels."kernels-community/activation".version``, ``[0].dependency.repo-id``."""
    out = ""
    for p in path:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += ("." if out else "") + (p if _BARE.fullmatch(p) else json.dumps(p))
    return out or "manifest"


class Source:
    """One manifest file being parsed. ``line_of(path)`` is format-specific and best effort."""

    def __init__(self, path: Path, text: str, line_of: Callable[[ValuePath], int | None]):
        self.path, self.text, self._line_of = path, text, line_of

    def line(self, path: ValuePath) -> int | None:
        return self._line_of(path) if path else None

    def at(self, path: ValuePath) -> str:
        """``file:line`` for a value (just ``file`` if no line is found): the specs' ``source``."""
        n = self.line(path)
        return str(self.path) if n is None else f"{self.path}:{n}"

    def error(self, path: ValuePath, what: str, *, missing: str | None = None, line: int | None = -1) -> ManifestError:
        """An error about the value at ``path``.

        ``missing``: the key ``missing`` is absent from the table at ``path``; the error names
        ``path.missing`` but points at the table, the nearest thing that exists.
        ``line``: override the located line (``None`` = no line can be known).
        """
        if line == -1:
            line = self.line(path)
        return ManifestError(self.path, line, field_name(path + ((missing,) if missing else ())), what)
