"""What `serve` cannot decide for its clients: which build their GPUs load.

A client reaching the mirror through HF_ENDPOINT runs kernels, which lists a commit's build/ and picks a
variant by name, then refuses to load it when its archs miss the device. serve does not know the client's
GPU; the home knows the arch targets something was staged for. Where the variant kernels would pick by
name among those serve lists at a commit does not load on one of such a target's archs, `serve`'s start-up
line and the page say so, and point at what does hand those nodes the build that loads: the arch target's
own `env` (LOCAL_KERNELS) or `export-cache`.
"""

from __future__ import annotations

from dataclasses import dataclass

from frt.resolver.archs import Declared, uncovered
from frt.resolver.targets import parse_target
from frt.resolver.variants import by_name_best

from ..store.home import Home
from ..store.records import MODEL_TARGET, staged_rows


@dataclass(frozen=True)
class NamePick:
    """At `commit`, kernels on `target`'s nodes would pick `picked` by name from what serve lists, and
    refuse it on `missing`; the target's own staged set holds `handed`."""

    repo: str
    commit: str
    target: str
    picked: str
    declared: Declared
    missing: tuple[str, ...]
    handed: str | None

    @property
    def text(self) -> str:
        return (
            f"{self.repo}@{self.commit[:12]}: through serve, kernels on {self.target} picks {self.picked} by "
            f"name ({self.declared.label}) and would refuse to load it on {', '.join(self.missing)}: hand "
            f"those nodes 'frt-mirror env --target {self.target}' or 'export-cache DIR --target {self.target}'"
            + (f", which give them {self.handed}" if self.handed else "")
        )


def name_picks(home: Home) -> list[NamePick]:
    """Every served commit × known arch target where kernels' pick by name would not load."""
    rows = [r for r in staged_rows(home.ledger) if r.target != MODEL_TARGET]
    targets = sorted({r.target for r in rows if "@" in r.target and not r.is_pulled})
    listed: dict[tuple[str, str], set[str]] = {}
    for r in rows:
        listed.setdefault((r.repo, r.commit), set()).add(r.variant)
    handed = {(r.repo, r.commit, r.target): r.variant for r in rows}
    out = []
    with home.ledger.view() as view:
        for text in targets:
            target = parse_target(text)
            for (repo, commit), names in sorted(listed.items()):
                picked = by_name_best(target, tuple(names))
                if picked is None:
                    continue
                declared = view.declared(repo, commit).get(picked, Declared(None, None))
                missing = uncovered(target.device, target.archs, declared)
                if missing:
                    out.append(
                        NamePick(repo, commit, text, picked, declared, missing, handed.get((repo, commit, text)))
                    )
    return out
