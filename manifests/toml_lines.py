"""Best-effort line numbers for values in a TOML file.

tomllib returns plain dicts with no positions, so to point an error at a line we re-scan the
source text: every table header (``[a.b]``, ``[[a]]``) and every ``key = ...`` line gets the full
path of the value it defines, e.g. the ``torch = 2.11`` line inside the second ``[[targets]]``
becomes ``("targets", 1, "torch")``. An error's path is then matched against these; the entry
sharing the longest prefix wins, so a value inside an inline table (``"org/x" = {version = 1}``)
falls back to the line of its key, and a value we cannot see falls back to its table header.

Not a TOML parser: lines inside multi-line strings may be misread, and nested arrays of tables
get approximate indices. Good enough for error messages, which is all this is used for.
"""

from __future__ import annotations

import re
from typing import TypeAlias

Path: TypeAlias = tuple[str | int, ...]  # a value path: str keys and int array indices, e.g. ("targets", 0, "torch")

# One part of a (dotted) key: "basic string", 'literal string', or a bare key.
_KEY_PART = re.compile(r"""[ \t]*(?:"((?:[^"\\]|\\.)*)"|'([^']*)'|([A-Za-z0-9_-]+))[ \t]*""")


def _dotted_key(s: str, pos: int) -> tuple[list[str], int] | None:
    """Parse a dotted key starting at ``s[pos]``: (its parts, the position after it) or None."""
    parts = []
    while True:
        m = _KEY_PART.match(s, pos)
        if not m:
            return None
        parts.append(next(g for g in m.groups() if g is not None))
        pos = m.end()
        if not s.startswith(".", pos):
            return parts, pos
        pos += 1


def _with_indices(key: tuple[str, ...], counts: dict[tuple[str, ...], int]) -> Path:
    """Put the current element index after every array-of-tables prefix of a header key."""
    out: list[str | int] = []
    for i in range(len(key)):
        out.append(key[i])
        if counts.get(key[: i + 1]):
            out.append(counts[key[: i + 1]] - 1)
    return tuple(out)


def scan(text: str) -> list[tuple[int, Path]]:
    """(line number, value path) for every table header and ``key =`` line, in file order."""
    entries: list[tuple[int, Path]] = []
    counts: dict[tuple[str, ...], int] = {}  # array-of-tables header -> elements seen so far
    table: Path = ()
    # Split on "\n" only: that is how tomllib counts lines (str.splitlines also splits on \x0c etc.).
    for n, line in enumerate(text.split("\n"), 1):
        s = line.lstrip()
        if s.startswith("["):
            array = s.startswith("[[")
            parsed = _dotted_key(s, 2 if array else 1)
            if not parsed or not s.startswith("]]" if array else "]", parsed[1]):
                continue
            key = tuple(parsed[0])
            if array:
                counts[key] = counts.get(key, 0) + 1
            table = _with_indices(key, counts)
            entries.append((n, table))
        else:
            parsed = _dotted_key(s, 0)
            if parsed and s.startswith("=", parsed[1]):
                entries.append((n, table + tuple(parsed[0])))
    return entries


def line_of(entries: list[tuple[int, Path]], path: Path) -> int | None:
    """The line that best matches ``path`` (longest shared prefix, first in file on ties), or None."""
    best, best_len = None, 0
    for n, p in entries:
        k = 0
        while k < min(len(p), len(path)) and p[k] == path[k]:
            k += 1
        if k > best_len:
            best, best_len = n, k
    return best
