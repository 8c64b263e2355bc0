"""constraints.txt: the versions of every package CI tested, for `pip install -c constraints.txt`.

`python -m tests.support.constraints > constraints.txt` writes it from the test venvs (`make constraints`):
the main venv's packages, then those only the huggingface_hub 1.33 venv has (its huggingface_hub itself is
named by the Makefile, and left out here: one file cannot pin two versions of a package).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
FILE = ROOT / "constraints.txt"
HEADER = """\
# The versions CI tested (make test, on Python 3.11): pip install -c constraints.txt ...
# Written by `make constraints` from the test venvs; tests/test_supported_versions.py fails when a venv
# holds another version. torch is CI's CPU build (2.13.0+cpu), pinned without its local label.
"""


def freeze(python: Path) -> dict[str, str]:
    """name -> version of what `python`'s venv holds (editable installs, ours, left out)."""
    out = subprocess.run([str(python), "-m", "pip", "freeze"], capture_output=True, text=True, check=True).stdout
    pins = {}
    for line in out.splitlines():
        if "==" in line and not line.startswith(("#", "-e")):
            req = Requirement(line)
            pins[canonicalize_name(req.name)] = next(iter(req.specifier)).version.split("+")[0]
    return pins


def pinned(text: str) -> dict[str, str]:
    """name -> version, from a constraints file's text."""
    reqs = (Requirement(ln) for ln in text.splitlines() if ln.strip() and not ln.startswith("#"))
    return {canonicalize_name(r.name): next(iter(r.specifier)).version for r in reqs}


def main() -> None:
    pins = freeze(ROOT / ".venv/bin/python")
    for name, version in freeze(ROOT / ".venv-hub1/bin/python").items():
        pins.setdefault(name, version)  # the main venv's huggingface_hub (2.x) wins
    sys.stdout.write(HEADER + "".join(f"{n}=={v}\n" for n, v in sorted(pins.items())))


if __name__ == "__main__":
    main()
