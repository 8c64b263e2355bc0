"""The shape of the code, checked: data flows one way (upstream -> resolver -> mirror -> seats -> adapters,
with the CLI on top), and no library module grows past ~400 lines."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# subpackage folder -> the frt subpackages it must never import
FORBIDDEN = {
    "manifests": ("frt.resolver", "frt.mirror", "frt.seats", "frt.adapters", "frt.cli"),
    "resolver": ("frt.mirror", "frt.seats", "frt.adapters", "frt.cli"),
    "mirror": ("frt.seats", "frt.adapters", "frt.cli"),
    "seats": ("frt.adapters", "frt.cli"),
    "adapters": ("frt.cli",),
}


def imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def library_modules():
    for folder in ("frt", *FORBIDDEN):
        yield from (ROOT / folder).rglob("*.py")


def test_data_flows_one_way():
    bad = []
    for folder, forbidden in FORBIDDEN.items():
        for path in (ROOT / folder).rglob("*.py"):
            for name in imports(path):
                if name.startswith(forbidden):
                    bad.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not bad, "\n".join(bad)


def test_no_library_module_past_400_lines():
    long = [f"{p.relative_to(ROOT)}: {n}" for p in library_modules()
            if (n := len(p.read_text().splitlines())) > 400]
    assert not long, long
