"""The shape of the code, checked: data flows one way (upstream -> resolver -> mirror -> seats -> adapters,
with the CLI on top), and no library module grows past ~400 lines."""

from __future__ import annotations

import ast
import re
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
    long = [f"{p.relative_to(ROOT)}: {n}" for p in library_modules() if (n := len(p.read_text().splitlines())) > 400]
    assert not long, long


HEAVY = ("sqlalchemy", "huggingface_hub", "kernels", "starlette", "uvicorn", "jinja2", "torch", "httpx")


def _imported_after(code: str) -> list[str]:
    import subprocess
    import sys

    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    return p.stdout.split()


def test_cli_start_up_imports_no_heavy_library():
    """`frt-mirror --help`, a usage error or `nginx-conf` need none of them: each command imports what it
    uses when it runs (start-up took ~1 s when frt.cli imported every layer)."""
    assert _imported_after("import frt.cli") == []
    assert (
        _imported_after(
            "import contextlib, io\nfrom frt.cli import cli\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
            "    cli(['--help'], prog_name='frt-mirror')"
        )
        == []
    )
    assert _imported_after("import frt.resolver.errors, frt.mirror.home_path, frt.mirror.serve.nginx") == []


PACKAGE_DIRS = {
    "frt": "frt",
    "frt.resolver": "resolver",
    "frt.mirror": "mirror",
    "frt.seats": "seats",
    "frt.adapters": "adapters",
    "frt.manifests": "manifests",
    "bench": "bench",
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT)
    for pkg, folder in sorted(PACKAGE_DIRS.items(), key=lambda kv: -len(kv[1])):
        if rel.parts[0] == folder:
            parts = [*pkg.split("."), *rel.with_suffix("").parts[1:]]
            return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    raise ValueError(path)


def _imports_anywhere(path: Path, name: str, known: set[str]) -> set[str]:
    """Every module of ours an import in `path` reaches, wherever it stands: at the top, inside a function,
    under `if TYPE_CHECKING:` (an import moved into a function to break a cycle is still one). `from P
    import x` reaches P itself too (P's __init__ runs first), and P.x where x is a module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {_ours(a.name, known) for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out |= {_ours(mod, known)} | {_ours(f"{mod}.{a.name}", known) for a in node.names}
    return out - {"", name}


def _ours(module: str, known: set[str]) -> str:
    """The module of ours that importing `module` (or a name in it) runs last; "" if none."""
    while module and module not in known:
        module = module.rpartition(".")[0]
    return module


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                out.append(sorted([v, *component]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _import_graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports anywhere, over the library and bench/."""
    files = {p: _module_name(p) for folder in PACKAGE_DIRS.values() for p in (ROOT / folder).rglob("*.py")}
    known = set(files.values())
    return {name: _imports_anywhere(path, name, known) for path, name in files.items()}


def test_nothing_below_imports_the_top_floor():
    """The CLI (frt.cli, and any module at frt's root) is the top floor: nothing below imports it."""
    top = ("frt.cli", *(f"frt.{p.stem}" for p in (ROOT / "frt").glob("*.py") if p.stem != "__init__"))
    up = [
        f"{name} imports {dep}"
        for name, deps in _import_graph().items()
        if not name.startswith(("frt.cli", "bench")) and name != "frt"
        for dep in sorted(deps)
        if dep.startswith(top)
    ]
    assert not up, "\n".join(up)


def test_no_import_cycles_in_the_library_or_bench():
    """No module reaches itself again through others' imports, counting every import: one inside a
    function or under TYPE_CHECKING is still an edge (a cycle that works only by the order things load,
    or because an import waits for a call, is still a cycle)."""
    cycles = _cycles(_import_graph())
    assert not cycles, "\n".join(" <-> ".join(c) for c in cycles)


# frt.mirror's rooms, along the data's path: each may import the flat modules at mirror's top and the
# rooms it names (mirror/__init__.py and each room's __init__ say the same). Flat modules import no room.
ROOMS = {
    "store": (),
    "stage": ("store",),
    "views": ("store",),
    "bisect": ("store", "stage", "views"),
    "bundle": ("store", "stage"),
    "serve": ("store", "stage"),
}
FLAT_AT_MIRROR = {"home_path", "schema", "events", "event_rows"}


def _room(module: str) -> str:
    """frt.mirror.<room>.x -> room; a flat module of frt.mirror -> "flat"."""
    part = module.split(".")[2] if module.count(".") >= 2 else ""
    return part if part in ROOMS else "flat"


def test_mirror_is_rooms_along_the_datas_path():
    assert {p.name for p in (ROOT / "mirror").iterdir() if p.suffix == ".py"} == {
        "__init__.py",
        *(f"{m}.py" for m in FLAT_AT_MIRROR),
    }
    assert {p.name for p in (ROOT / "mirror").iterdir() if p.is_dir() and (p / "__init__.py").exists()} == set(ROOMS)
    bad = []
    for name, deps in _import_graph().items():
        if not name.startswith("frt.mirror."):
            continue
        room, allowed = _room(name), ROOMS.get(_room(name), ())
        for dep in sorted(d for d in deps if d.startswith("frt.mirror.")):
            there = _room(dep)
            if there != room and there != "flat" and there not in allowed:
                bad.append(f"{name} ({room}) imports {dep} ({there})")
    assert not bad, "\n".join(bad)
    for room, allowed in ROOMS.items():
        doc = ast.get_docstring(ast.parse((ROOT / "mirror" / room / "__init__.py").read_text())) or ""
        said = doc.rpartition("May import:")[2] if "May import:" in doc else ""
        assert (
            said
            and all(r in said for r in allowed)
            and not (set(ROOMS) - {room, *allowed}) & set(re.findall(r"\w+", said))
        ), f"mirror/{room}/__init__.py must say which rooms it may import: {allowed or 'none'}"


def _is_test_module(name: str) -> bool:
    """tests.test_x, tests.engines.test_y, or a conftest: modules pytest loads itself."""
    parts = name.split(".")
    return parts[0] == "tests" and (parts[-1].startswith("test_") or parts[-1] == "conftest")


def _imported_modules(path: Path) -> set[str]:
    """Every module an import in `path` may name, at any depth (imports inside functions too), relative ones
    resolved; `from a import b` names both a and a.b (b may be a module)."""
    package = path.relative_to(ROOT).parent.parts  # a module's, or an __init__.py's own
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = list(package[: len(package) - node.level + 1]) if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            out |= {mod} | {f"{mod}.{a.name}" for a in node.names}
    return out


def test_no_test_imports_another_test():
    """What tests share lives in tests/support/ (helpers) and tests/conftest.py (fixtures): no test file,
    helper or bench imports a test module or a conftest, which are pytest's to load (an imported test module
    is a second copy of its fixtures and its tests)."""
    bad = []
    for path in sorted([*(ROOT / "tests").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]):
        own = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        bad += [
            f"{path.relative_to(ROOT)} imports {m}"
            for m in sorted(_imported_modules(path))
            if _is_test_module(m) and m != own
        ]
    assert not bad, "\n".join(bad)
