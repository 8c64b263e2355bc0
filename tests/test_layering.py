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
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT)
    for pkg, folder in sorted(PACKAGE_DIRS.items(), key=lambda kv: -len(kv[1])):
        if rel.parts[0] == folder:
            parts = [*pkg.split("."), *rel.with_suffix("").parts[1:]]
            return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    raise ValueError(path)


def _load_time_imports(path: Path, name: str, known: set[str]) -> set[str]:
    """What importing the module imports: its top-level imports (not those inside functions, which run
    later, nor `if TYPE_CHECKING:` ones), relative ones resolved."""
    is_pkg = path.name == "__init__.py"
    out = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out |= {f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in node.names}
    # A module's own packages are already importing when it loads: depending on them is no cycle.
    return {m for m in out if m.startswith("frt") and not name.startswith(f"{m}.")}


def test_nothing_below_imports_the_top_floor_and_modules_import_without_cycles():
    """The CLI (frt.cli, and any module at frt's root) is the top floor: nothing below imports it. And no
    module's import reaches itself again through others' (a cycle works only by the order things load)."""
    files = {p: _module_name(p) for folder in PACKAGE_DIRS.values() for p in (ROOT / folder).rglob("*.py")}
    known = set(files.values())
    top = ("frt.cli", *(f"frt.{p.stem}" for p in (ROOT / "frt").glob("*.py") if p.stem != "__init__"))
    graph = {}
    up = []
    for path, name in files.items():
        deps = {d for d in _load_time_imports(path, name, known) if d in known and d != name}
        graph[name] = deps
        if not name.startswith(("frt.cli", "frt.__init__")) and name != "frt":
            up += [f"{name} imports {n}" for n in imports(path) if n.startswith(top)]
    assert not up, "\n".join(up)
    state, cycles = {}, []

    def visit(n, stack):
        state[n] = 1
        for d in sorted(graph.get(n, ())):
            if state.get(d) == 1:
                cycles.append(" -> ".join(stack[stack.index(d) :] + [d]))
            elif d not in state:
                visit(d, stack + [d])
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n, [n])
    assert not cycles, "\n".join(cycles)


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
