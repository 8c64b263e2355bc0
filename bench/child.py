"""A bench's measured side runs in a child interpreter (a process of its own: nothing imported or cached
by the parent), given its job as arguments or JSON on stdin, and prints its figures as a JSON line last."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_child(
    module: str, *args: str, job: object = None, env: dict[str, str] | None = None, timeout: float = 600
) -> Any:
    """`python -m module *args` with `job` on stdin; its last stdout line, parsed. A child that fails
    ends the bench with its stderr's tail."""
    out = subprocess.run(
        [sys.executable, "-m", module, *args],
        input=None if job is None else json.dumps(job),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )
    if out.returncode:
        sys.exit(f"{module} {' '.join(args[:1])} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])
