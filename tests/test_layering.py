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
    assert _imported_after("import contextlib, io\nfrom frt.cli import cli\n"
                           "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
                           "    cli(['--help'], prog_name='frt-mirror')") == []
    assert _imported_after("import frt.resolver.errors, frt.mirror.home_path, frt.mirror.serve.nginx") == []


def test_lazy_package_names_are_what_they_were():
    """frt.resolver's and frt.mirror.serve's names are imported on first use; a name shared with its
    submodule (resolve, scan, listen) is still the function, whichever was imported first."""
    import types

    import frt.mirror.serve.listen  # noqa: F401  (the submodule first: the import system binds it on the package)
    import frt.resolver.scan  # noqa: F401
    from frt.mirror.serve import listen, make_app
    from frt.resolver import Ledger, resolve, scan

    for f in (listen, make_app, resolve, scan):
        assert isinstance(f, types.FunctionType), f
    assert Ledger.__module__ == "frt.resolver.ledger"
    import frt.resolver

    assert sorted(frt.resolver.__all__) == frt.resolver.__all__ and "HubClient" in frt.resolver.__all__
