"""Which modules of a model a catalog names: path suffix patterns and class names, first seat wins."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from frt.manifests import SeatCatalog, SeatSpec

from .seat import Seat


@dataclass(frozen=True)
class Site:
    path: str  # dotted module path in the model, "model.layers.3.mlp.down_proj"
    module: torch.nn.Module
    spec: SeatSpec

    @property
    def parent_path(self) -> str:
        return self.path.rpartition(".")[0]

    @property
    def attr(self) -> str:
        return self.path.rpartition(".")[2]


def _suffix_matches(pattern: tuple[str, ...], parts: list[str]) -> bool:
    if len(pattern) > len(parts):
        return False
    return all(p == "*" or p == q for p, q in zip(pattern, parts[len(parts) - len(pattern) :], strict=False))


def matches(spec: SeatSpec, path: str, module: torch.nn.Module) -> bool:
    if type(module).__name__ in spec.match_class:
        return True
    parts = path.split(".")
    return any(_suffix_matches(tuple(p.split(".")), parts) for p in spec.match)


def find_sites(model: torch.nn.Module, catalog: SeatCatalog) -> tuple[list[Site], list[str], list[str]]:
    """(sites, nested, unmatched seat labels).

    A module inside an already matched one is *nested*: the outer seat owns it (an expert bank's
    ``act_fn``), so it is listed, not seated. The model itself (path "") is never a site: there is
    no parent to put a seat into.
    """
    sites: list[Site] = []
    nested: list[str] = []
    taken: set[str] = set()
    used: set[int] = set()
    for path, module in model.named_modules():
        if not path:
            continue
        prefix = path.split(".")
        inside = any(".".join(prefix[:n]) in taken for n in range(1, len(prefix)))
        if isinstance(module, Seat) and not inside:
            taken.add(path)  # an earlier attach's seat: what it wraps is not ours to seat again
        spec_i = next((i for i, s in enumerate(catalog.seats) if matches(s, path, module)), None)
        if spec_i is None:
            continue
        if inside:
            nested.append(path)
            continue
        taken.add(path)
        used.add(spec_i)
        sites.append(Site(path, module, catalog.seats[spec_i]))
    unmatched = [s.label for i, s in enumerate(catalog.seats) if i not in used]
    return sites, nested, unmatched
