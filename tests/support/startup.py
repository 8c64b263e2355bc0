"""What a CLI command imports: run it in a fresh interpreter and read sys.modules as it exits (the start-up
tests of env, report and verify: each must answer without the heavy libraries)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.support.cli import cli_env

HEAVY = ("sqlalchemy", "huggingface_hub", "kernels", "torch", "starlette", "uvicorn", "jinja2", "httpx", "filelock")


def loaded_after(argv: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    """Run the CLI in a fresh interpreter; the modules it had loaded at exit: ours, the heavy packages by
    top-level name, and every heavy module by its full name ("modules")."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "modules.json"
        probe = (
            "import atexit, json, sys\n"
            "def _report():\n"
            f"    mods = [m for m in sys.modules if m.startswith('frt.') or m.split('.')[0] in {HEAVY!r}]\n"
            f"    open({str(out)!r}, 'w').write(json.dumps(sorted(mods)))\n"
            "atexit.register(_report)\n"
            "from frt.cli import main\n"
            f"sys.argv = ['frt-mirror', *{argv!r}]\n"
            "main()\n"
        )
        p = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env={**cli_env(), **(env or {})}
        )
        mods = json.loads(out.read_text()) if out.exists() else []
    heavy = sorted({m.split(".")[0] for m in mods} & set(HEAVY))
    ours = [m for m in mods if m.startswith("frt.")]
    return p, {"ours": ours, "heavy": heavy, "modules": [m for m in mods if not m.startswith("frt.")]}
