"""What is staged, as a row: the StagedRow every room passes around, and the one quick read of it that a
cluster's job start makes (`env --target`) from a SQLite ledger with the standard library alone, with no
SQLAlchemy to import (records.py writes and reads these rows through the ledger)."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frt.resolver.ledger_file import SCHEMA_VERSION, TABLES, quick_read

from ..home_path import MIRROR_TABLES, MIRROR_VERSION

# A staged model selection is target-less: its row carries this in place of a target (never a target
# string, which always starts with "torch"), and its files are the Variant row MODEL_SELECTION (see
# frt.mirror.stage.models).
MODEL_TARGET = "model"
MODEL_SELECTION = "files"
# A kernel variant a client pulled through `serve --upstream` (frt.mirror.serve.pull_through) was asked for by no
# target: its row's target is PULLED + the variant's name, and a target's staged set takes it where that
# target accepts the variant (see staged_for).
PULLED = "pulled:"


@dataclass(frozen=True)
class StagedRow:
    repo: str
    requested: str
    version: int | None
    revision: str | None
    target: str
    commit: str
    variant: str
    wheels: tuple[str, ...] = ()  # filenames of the wheels its python-depends need on its target

    def __post_init__(self) -> None:
        if not isinstance(self.wheels, tuple):  # a bundle's JSON gives a list
            object.__setattr__(self, "wheels", tuple(self.wheels))

    def to_json(self) -> dict[str, Any]:
        """The row as bundles and --json carry it; `wheels` only where it has some (so a row without
        any reads, and fingerprints, as it did before wheels were staged)."""
        out = dict(self.__dict__)
        if self.wheels:
            out["wheels"] = list(self.wheels)
        else:
            del out["wheels"]
        return out

    @property
    def key(self) -> tuple[str, str, str]:
        """The row's natural key in the ledger: one staged row per repo, request and target."""
        return self.repo, self.requested, self.target

    @property
    def is_model(self) -> bool:
        return self.target == MODEL_TARGET

    @property
    def is_pulled(self) -> bool:
        return self.target.startswith(PULLED)

    @property
    def repo_type(self) -> str:
        """ "model" for every target-less row, datasets too (bundles record it so): where a dataset must
        be told apart (serving it, a cache folder), see repo_types."""
        return "model" if self.is_model else "kernel"


# The schema versions a quick read of the ledger answers at (both tracks: the ledger's own path checks both).
QUICK_VERSIONS = {"schema_migrations": SCHEMA_VERSION, "mirror_schema_migrations": MIRROR_VERSION}
QUICK_TABLES = TABLES | MIRROR_TABLES


def quick_staged(ledger: Path, target: str) -> list[StagedRow] | None:
    """records.staged_for(target) read with sqlite3 from the SQLite ledger at `ledger`: the same rows in
    the same order, or None where only the ledger's own path can answer (ledger_file.quick_read's cases;
    and pulled-through rows, whose choice needs kernels' variant rules)."""
    return quick_read(ledger, QUICK_VERSIONS, QUICK_TABLES, lambda conn: read_staged(conn, target))


def read_staged(conn: sqlite3.Connection, target: str | None) -> list[StagedRow] | None:
    """The rows staged for `target` (None: every row), as records.staged_rows reads them; None where a
    target's pulled-through rows are there (which of them it takes is kernels' rule: records.staged_for)."""
    pulled = "SELECT 1 FROM staged WHERE substr(target, 1, ?) = ? LIMIT 1"
    if target is not None and target.startswith("torch") and conn.execute(pulled, (len(PULLED), PULLED)).fetchone():
        return None
    wheels: dict[tuple[str, str, str], list[str]] = {}
    for repo, requested, tgt, filename in conn.execute(
        "SELECT repo_id, requested, target, filename FROM staged_wheels ORDER BY filename"
    ):
        wheels.setdefault((repo, requested, tgt), []).append(filename)
    rows = conn.execute(
        "SELECT repo_id, requested, version, revision, target, commit_sha, variant FROM staged "
        "WHERE ?1 IS NULL OR target = ?1 ORDER BY repo_id, version, requested, target",
        (target,),
    )
    return [
        StagedRow(
            repo, requested, version, revision, tgt, commit, variant, tuple(wheels.get((repo, requested, tgt), ()))
        )
        for repo, requested, version, revision, tgt, commit, variant in rows
    ]
