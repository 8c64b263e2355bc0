"""kernels.lock, the JSON lockfile that ``kernels lock`` (kernels >= 0.17) writes:

    [ { "dependency": { "repo-id": "org/name", "version": 1 },
        "lock": { "commit": "<40 hex>" } } ]

A lock pins commits, so each entry becomes KernelSpec(repo, revision=<commit>), with the version
it was locked from kept as ``locked_version``. The checks mirror kernels' own parser (the
``KernelLocks.from_json`` Rust code), so a file we accept is one kernels accepts too.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from .fields import check_version, repo_id_problem
from .model import KernelSpec, Manifest, ManifestError, Trust
from .source import Source, ValuePath

_WS = re.compile(r"[ \t\n\r]*")
_COMMIT = re.compile(r"[0-9a-fA-F]{40}|[0-9a-fA-F]{64}")  # SHA-1 or SHA-256 git object id
_OLD_KEYS = ("repo_id", "sha", "variants")  # the <= 0.16 format, which kernels 0.17 refuses


def parse_lock(path: Path, text: str) -> Manifest:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        what = f"{e.msg} (column {e.colno}); kernels.lock is JSON"
        raise ManifestError(path, e.lineno, "syntax", what) from None
    except RecursionError:  # json recurses per nesting level: `[[[[…` 100k deep
        raise ManifestError(
            path,
            None,
            "syntax",
            "arrays or objects nested too deeply (past Python's recursion limit; kernels.lock nests three levels)",
        ) from None
    except ValueError as e:  # an integer of over 4300 digits (int()'s own limit)
        raise ManifestError(path, None, "syntax", str(e).splitlines()[0]) from None
    spans = _entry_spans(text) if isinstance(data, list) else []
    src = Source(path, text, lambda p: _line_of(text, spans, p))
    if not isinstance(data, list):
        raise src.error((), "must be a JSON array of {dependency, lock} entries, as `kernels lock` writes", line=1)
    if not data:
        raise src.error((), "is empty: nothing to stage", line=1)
    kernels: list[KernelSpec] = []
    seen: set[tuple[str, str, object]] = set()
    for i, entry in enumerate(data):
        spec, dep = _entry(src, entry, (i,))
        if dep in seen:  # kernels' parser refuses this too ("duplicate dependency")
            raise src.error((i, "dependency"), f"duplicate dependency {dep[0]!r} {dep[1]}={dep[2]!r}")
        seen.add(dep)
        kernels.append(spec)
    return Manifest(path, "kernels.lock", (), tuple(kernels), Trust())


def _entry(src: Source, entry: object, path: ValuePath) -> tuple[KernelSpec, tuple[str, str, object]]:
    if not isinstance(entry, dict):
        raise src.error(path, "must be an object with dependency and lock")
    old = [k for k in _OLD_KEYS if k in entry]
    if old:
        raise src.error(
            path + (old[0],),
            "this is the pre-0.17 kernels.lock format (repo_id/sha/variants); "
            "re-run `kernels lock` with kernels >= 0.17",
        )
    _known_keys(src, entry, path, ("dependency", "lock"))
    dep, lock = entry["dependency"], entry["lock"]
    if not isinstance(dep, dict):
        raise src.error(path + ("dependency",), 'must be an object like {"repo-id": "org/name", "version": 1}')
    _known_keys(src, dep, path + ("dependency",), ("repo-id",), optional=("version", "revision"))
    repo = dep["repo-id"]
    problem = repo_id_problem(repo)
    if problem:
        raise src.error(path + ("dependency", "repo-id"), problem)
    if ("version" in dep) == ("revision" in dep):
        raise src.error(path + ("dependency",), "needs exactly one of version or revision")
    version = None
    if "version" in dep:
        version = check_version(src, dep["version"], path + ("dependency", "version"))
    if not isinstance(lock, dict):
        raise src.error(path + ("lock",), 'must be an object like {"commit": "<40 hex digits>"}')
    _known_keys(src, lock, path + ("lock",), ("commit",))
    commit = lock["commit"]
    if not isinstance(commit, str) or not _COMMIT.fullmatch(commit):
        raise src.error(path + ("lock", "commit"), f"must be a full commit id (40 or 64 hex digits), got {commit!r}")
    # kernels stores commits lowercased; do the same so the same lock compares equal either way.
    spec = KernelSpec(repo, revision=commit.lower(), locked_version=version, source=src.at(path))
    kind = "version" if "version" in dep else "revision"
    return spec, (repo, kind, dep[kind])


def _known_keys(
    src: Source, obj: dict[str, object], path: ValuePath, required: tuple[str, ...], optional: tuple[str, ...] = ()
) -> None:
    for key in obj:
        if key not in required + optional:
            raise src.error(path + (key,), f"unknown key; expected {', '.join(required + optional)}")
    for key in required:
        if key not in obj:
            raise src.error(path, "missing", missing=key)


def _entry_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) offsets of each element of the top-level JSON array (already known valid).

    json gives no positions for values, but raw_decode reports where each element ends, so
    walking the array one element at a time recovers exact spans for error lines.
    """
    dec = json.JSONDecoder()
    spans: list[tuple[int, int]] = []
    pos = _ws_end(text, 0) + 1  # just past '['
    while True:
        pos = _ws_end(text, pos)
        if text.startswith("]", pos):
            return spans
        _, end = dec.raw_decode(text, pos)
        spans.append((pos, end))
        pos = _ws_end(text, end)
        if not text.startswith(",", pos):
            return spans
        pos += 1


def _ws_end(text: str, pos: int) -> int:
    """Where the whitespace starting at ``pos`` ends."""
    m = _WS.match(text, pos)
    assert m is not None  # _WS matches the empty string too: it matches at every position
    return m.end()


def _line_of(text: str, spans: list[tuple[int, int]], path: ValuePath) -> int | None:
    """Line of the entry ``path[0]``, narrowed to the last of ``path[1:]``'s keys found in order
    inside it (so ``(2, "lock", "commit")`` finds the ``"commit"`` line of the third entry)."""
    if not path or not isinstance(path[0], int) or path[0] >= len(spans):
        return None
    pos, end = spans[path[0]]
    for key in path[1:]:
        found = text.find(json.dumps(key), pos, end)
        if found < 0:
            break
        pos = found
    return text.count("\n", 0, pos) + 1
