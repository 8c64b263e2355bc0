"""kernels' decisions, remembered per kernels installation: importing kernels costs a reading command
(`matrix` on a small home) about four times Python's start-up with click, since its package imports
huggingface_hub's hf_api, while what variants.py and archs.py ask of it is a pure function of the inputs
they pass. So each answer is kept, keyed by those inputs, in a file in the user's cache folder (as
host_cache.py keeps `--target host`); a later process reads the answer there and needs no kernels.

Whoever records a repo's variants (scan, stage) decides them for its matrix there and then, kernels being
imported already (frt.mirror.store.matrix_reads), so the first `matrix` after it finds every answer it
needs. An answer not kept yet is kernels' own, computed now and kept.

What an answer depends on, and so the key: the inputs, each entry's own key (the JSON of what is passed
to kernels); the installation, the file's key: kernels' version (the name of its dist-info folder), the
size and modification time of the kernels modules that decide and of ours that ask them (an editable
install, or a rule of ours changed, keeps the version but not these), and this file's format. A file
with another key is read as empty and replaced on the next save. A cache that cannot be read or written
is kernels every time.
"""

from __future__ import annotations

import importlib.util
import json
import os
import zlib
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

from .fs import atomic_write
from .host_cache import cache_dir

# Bumped when what is kept changes shape.
_FORMAT = 1
# kernels' modules whose code the answers come from, and ours that ask them.
_KERNELS_RULES = ("variants.py", "backends.py", "archs.py")
_OURS = (Path(__file__).with_name("variants.py"), Path(__file__).with_name("archs.py"))

Answer = list[Any]  # a JSON array: what each rule returns, so a kept answer and a fresh one are alike


class Memo:
    """One kernels installation's answers, by rule and inputs: read from `path` on first use, added to
    as kernels answers more in this process, and written back by save()."""

    def __init__(self, path: Path | None, key: str):
        self.path, self.key = path, key  # path None: no kernels installed, nothing to keep
        self._kept: dict[str, dict[str, Answer]] | None = None
        self._new: dict[str, dict[str, Answer]] = {}

    def answer(self, rule: str, inputs: list[Any], ask: Callable[..., Answer]) -> Answer:
        """`ask(*inputs)`, kernels' answer, from what is kept where it is there."""
        key = json.dumps(inputs, separators=(",", ":"))
        kept = self._read().get(rule, {}).get(key)
        if kept is None:
            kept = self._new.get(rule, {}).get(key)
        if kept is None:
            kept = ask(*inputs)
            self._new.setdefault(rule, {})[key] = kept
        return kept

    def save(self) -> None:
        """Keep what this process learnt, beside what another one kept meanwhile (answers are pure, so a
        union is right; a racing writer's answers lost are only asked again)."""
        if not self._new or self.path is None:
            return
        kept = _load(self.path, self.key)
        for rule, answers in self._new.items():
            kept.setdefault(rule, {}).update(answers)
        try:
            # whole or absent: a reader at the same moment asks kernels
            atomic_write(self.path, json.dumps({"key": self.key, "rules": kept}, separators=(",", ":")))
        except OSError:
            return  # a read-only cache folder (a cluster's): kernels every time, as before the memo
        self._kept, self._new = kept, {}

    def _read(self) -> dict[str, dict[str, Answer]]:
        if self._kept is None:
            self._kept = _load(self.path, self.key) if self.path is not None else {}
        return self._kept


def memo() -> Memo:
    """This process's memo, for the kernels importable here (found, not imported), in the cache folder
    the environment names now."""
    return _memo(cache_dir())


@lru_cache(maxsize=4)
def _memo(cache: Path) -> Memo:
    spec = importlib.util.find_spec("kernels")
    if spec is None or not spec.submodule_search_locations:
        return Memo(None, "")
    where = Path(next(iter(spec.submodule_search_locations)))
    version, key = installation(where)
    return Memo(cache / "kernels-decisions" / f"{version}-{zlib.crc32(str(where).encode()):08x}.json", key)


def installation(kernels_dir: Path) -> tuple[str, str]:
    """(kernels' version, the whole key) of the kernels package at `kernels_dir`."""
    dist = sorted(n for n in _listing(kernels_dir.parent) if n.startswith("kernels-") and n.endswith(".dist-info"))
    version = dist[0][len("kernels-") : -len(".dist-info")] if dist else "unknown"
    parts: list[object] = [_FORMAT, version, str(kernels_dir)]
    for path in [*(kernels_dir / name for name in _KERNELS_RULES), *_OURS]:
        try:
            st = os.stat(path)
            parts.append((path.name, st.st_size, st.st_mtime_ns))
        except OSError:
            parts.append((path.name, None))
    return version, repr(parts)


def _listing(folder: Path) -> list[str]:
    try:
        return os.listdir(folder)
    except OSError:
        return []


def _load(path: Path, key: str) -> dict[str, dict[str, Answer]]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    rules = doc.get("rules") if isinstance(doc, dict) and doc.get("key") == key else None
    if not isinstance(rules, dict):
        return {}
    return {rule: answers for rule, answers in rules.items() if isinstance(answers, dict)}
