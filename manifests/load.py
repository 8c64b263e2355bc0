"""``load_manifest``: read any input ``frt-mirror stage [MANIFEST]`` accepts, by name and content."""

from __future__ import annotations

import re
import tomllib
from functools import partial
from pathlib import Path
from typing import Any

from .lockfmt import parse_lock
from .model import Manifest, ManifestError
from .source import Source
from .toml_lines import line_of, scan
from .tomlfmt import parse_frt, parse_pyproject

# A directory is searched for these, first found wins: our own manifest (most specific), then
# the project's pyproject.toml, then a bare kernels.lock. Pass the file itself to pick another.
DIR_ORDER = ("frt-manifest.toml", "pyproject.toml", "kernels.lock")

# A JSON array of objects (or an empty one). A TOML file can also start with '[' (a table
# header), but a header's '[' is never followed by '{' or ']'.
_JSON_START = re.compile(r"\s*\[\s*[{\]]")
_TOML_POS = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")


def load_manifest(path: str | Path) -> Manifest:
    """Parse a manifest file, or the first of DIR_ORDER inside a directory.

    - ``kernels.lock`` by name, ``*.json``, or any file whose content is a JSON array → kernels.lock;
    - ``pyproject.toml`` by name, or any TOML with a top-level ``tool`` table → pyproject;
    - any other TOML → the frt manifest.

    Raises ManifestError (``file:line: field: what``) for anything unreadable or invalid.
    """
    path = Path(path)
    if path.is_dir():
        path = _pick(path)
    text = _read(path)
    if path.name == "kernels.lock" or path.suffix == ".json" or _JSON_START.match(text):
        return parse_lock(path, text)
    data = _parse_toml(path, text)
    src = Source(path, text, partial(line_of, scan(text)))
    if path.name == "pyproject.toml" or "tool" in data:
        return parse_pyproject(src, data)
    return parse_frt(src, data)


def _pick(directory: Path) -> Path:
    for name in DIR_ORDER:
        if (directory / name).is_file():
            return directory / name
    raise ManifestError(directory, None, "manifest", f"no {', '.join(DIR_ORDER)} in this directory")


def _read(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ManifestError(path, None, "manifest", "no such file") from None
    except OSError as e:
        raise ManifestError(path, None, "manifest", f"cannot read: {e.strerror or e}") from None
    try:
        # utf-8-sig: tolerate the BOM some Windows editors add; tomllib and json both reject it.
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise ManifestError(path, line, "encoding", f"not UTF-8 text (byte {e.start})") from None


def _parse_toml(path: Path, text: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except RecursionError:  # tomllib recurses per nesting level: `a = [[[[…` 100k deep
        raise ManifestError(
            path,
            None,
            "syntax",
            "arrays or tables nested too deeply (past Python's recursion limit; a manifest nests three or four levels)",
        ) from None
    except tomllib.TOMLDecodeError as e:
        # tomllib puts the position in the message: "Invalid value (at line 3, column 9)", or
        # "(at end of document)". Move it to the file:line prefix the contract asks for.
        msg = str(e).splitlines()[0]
        m = _TOML_POS.search(msg)
        if m:
            raise ManifestError(path, int(m[1]), "syntax", f"{msg[: m.start()]} (column {m[2]})") from None
        if msg.endswith("(at end of document)"):
            msg = msg[: -len("(at end of document)")].rstrip()
            raise ManifestError(path, text.count("\n") + 1, "syntax", f"{msg} (at end of file)") from None
        raise ManifestError(path, None, "syntax", msg) from None
    except ValueError as e:  # not a TOMLDecodeError: an integer of over 4300 digits (int()'s own limit)
        raise ManifestError(path, None, "syntax", str(e).splitlines()[0]) from None
