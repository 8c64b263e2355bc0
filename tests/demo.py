"""`make demo`: the main job on an embedded default.

Starts a demo upstream (a fake Hub serving the project's own fixture kernel repos),
then runs the real `frt-mirror` CLI against it: scan, resolve for two targets, the
aarch64 trap explained, the availability matrix, and the refusal report.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.fakehub import FakeHub
from tests.kernel_fixtures import ORG, demo_repos

HOME = Path("demo-home")
ACT, RELU = f"{ORG}/activation", f"{ORG}/relu"
TARGETS = ["torch2.11-cu130-aarch64-linux", "torch2.13-cpu-x86_64-linux"]


def step(title: str, *args: str, env: dict) -> int:
    print(f"\n## {title}\n$ frt-mirror {' '.join(args)}", flush=True)
    exe = Path(sys.executable).with_name("frt-mirror")
    return subprocess.run([str(exe), "--home", str(HOME), *args], env=env).returncode


def main() -> int:
    shutil.rmtree(HOME, ignore_errors=True)
    with FakeHub(demo_repos(), trusted_orgs=[ORG]) as hub:
        env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_XET": "1"}
        print(f"demo upstream: {hub.url} (fixture repos {ACT}, {RELU}); home: {HOME}/")
        failed = step("Record what upstream has", "scan", ACT, RELU, env=env)
        for t in TARGETS:
            failed |= step(f"Resolve {ACT} v2 for {t}", "resolve", ACT, "--version", "2", "--target", t, env=env)
        rc = step(f"The aarch64 trap: v1 for {TARGETS[0]} (expected refusal, exit 1)",
                  "resolve", ACT, "--version", "1", "--target", TARGETS[0], env=env)
        failed |= rc != 1
        failed |= step("Availability matrix", "matrix", ACT, env=env)
        failed |= step("Refusals on record", "report", env=env)
    print("\ndemo " + ("FAILED" if failed else "done"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
