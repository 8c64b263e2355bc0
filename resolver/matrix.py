"""The availability matrix: which revision has a build for which torch/CUDA/arch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from .commit_records import CommitRow
from .core import Builds, judge
from .targets import Target, make_target
from .variants import by_name_best, parse_fields


class MatrixSource(Builds, Protocol):
    """What the matrix reads of the ledger: a LedgerView, or a repo read whole with sqlite3 alone
    (commit_records.RepoRecords)."""

    def refs(self, repo_id: str) -> list[tuple[str, str, str]]: ...
    def commits(self, repo_id: str) -> list[CommitRow]: ...
    def declared_all(self, repo_id: str) -> None: ...


@dataclass(frozen=True)
class MatrixRow:
    commit: str
    date: datetime | None
    title: str
    refs: tuple[str, ...]  # branch and tag names pointing here
    variants: frozenset[str]
    serves: dict[str, str | None] = field(default_factory=dict)  # target -> chosen variant or None
    no_digest: frozenset[str] = frozenset()  # variants whose metadata.json carries no publisher digest
    archs: dict[str, tuple[str, ...] | None] = field(default_factory=dict)  # variant -> its declared archs
    # arch target -> the variant kernels picks by name, where that is not the one served: it would raise there
    by_name: dict[str, str] = field(default_factory=dict)

    def fallback(self, target: str) -> bool:
        """Served by a build other than kernels' pick by name (which does not load on the target's archs)."""
        return target in self.by_name and self.serves.get(target) is not None


@dataclass(frozen=True)
class Matrix:
    repo: str
    variants: tuple[str, ...]
    targets: tuple[Target, ...]
    rows: tuple[MatrixRow, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "repo": self.repo,
            "variants": list(self.variants),
            "targets": [str(t) for t in self.targets],
            "target_archs": {str(t): list(t.archs) for t in self.targets},
            "revisions": [
                {
                    "commit": r.commit,
                    "date": r.date.isoformat() if r.date else None,
                    "title": r.title,
                    "refs": list(r.refs),
                    "variants": sorted(r.variants),
                    "serves": r.serves,
                    "no_digest": sorted(r.no_digest),
                    "archs": {v: list(a) if a else None for v, a in sorted(r.archs.items())},
                    "by_name": r.by_name,
                }
                for r in self.rows
            ],
        }


def targets_named_by(variants: list[str] | tuple[str, ...]) -> list[Target]:
    """The targets a repo's arch variants were built for: the 'known' targets of its matrix."""
    out = set()
    for name in variants:
        f = parse_fields(name)
        if f and f.framework == "torch" and f.cpu and f.os:
            out.add(make_target(torch=f.framework_version, backend=f.backend, cpu=f.cpu, os=f.os))
    return sorted(out, key=str)


def build_matrix(
    view: MatrixSource, repo_id: str, targets: list[Target] | None = None, *, also: Sequence[Target] = ()
) -> Matrix:
    """`targets`: the columns; default, the targets the repo's variants were built for and `also` (those
    it is staged for: a noarch-only repo names none)."""
    commits = [c for c in view.commits(repo_id) if c.scanned]
    names = sorted({v for c in commits for v in c.variants})
    if not targets:
        targets = sorted({str(t): t for t in [*targets_named_by(names), *also]}.values(), key=str)
    refs: dict[str, list[str]] = {}
    for _kind, name, sha in view.refs(repo_id):
        refs.setdefault(sha, []).append(name)
    view.declared_all(repo_id)
    rows = []
    for c in commits:
        present = tuple(c.variants)
        serves, by_name = {}, {}
        for t in targets:
            serves[str(t)] = next((d.name for d in judge(view, repo_id, c.sha, t, present) if d.accepted), None)
            pick = by_name_best(t, present) if t.archs else None
            if pick is not None and pick != serves[str(t)]:
                by_name[str(t)] = pick
        archs = {name: d.archs for name, d in view.declared(repo_id, c.sha).items()}
        rows.append(
            MatrixRow(
                c.sha,
                c.date,
                c.title,
                tuple(sorted(refs.get(c.sha, []))),
                frozenset(present),
                serves,
                frozenset(c.no_digest),
                archs,
                by_name,
            )
        )
    return Matrix(repo_id, tuple(names), tuple(targets), tuple(rows))
