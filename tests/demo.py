"""`make demo`: the main job on an embedded default.

Starts a demo upstream (a fake Hub serving the project's own fixture kernel repos), then
runs the real `frt-mirror` CLI against it, as an operator would on a connected box:
stage a manifest for two targets, verify the store, print the availability matrix and the
cluster's environment, and show the refusal the aarch64 trap produces.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.fakehub import FakeHub
from tests.support.kernel_fixtures import ORG, demo_repos

HOME = Path("demo-home")
ACT = f"{ORG}/activation"
MANIFEST = f"""\
# The demo manifest: two targets, three kernels (layernorm pulls activation v2 as a kernel-depends).
[[targets]]
name = "gh200"
target = "torch2.11-cu130-aarch64-linux"

[[targets]]
name = "x86-cpu"
target = "torch2.13-cpu-x86_64-linux"

[kernels]
"{ORG}/layernorm" = {{ version = 1 }}
"{ORG}/relu" = {{ version = 1 }}
"{ORG}/activation" = {{ version = 2 }}

[trust]
publishers = ["{ORG}"]
"""


def step(title: str, *args: str, env: dict, expect: int = 0) -> bool:
    print(f"\n## {title}\n$ frt-mirror {' '.join(args)}", flush=True)
    exe = Path(sys.executable).with_name("frt-mirror")
    rc = subprocess.run([str(exe), "--home", str(HOME), *args], env=env).returncode
    return rc == expect


def main() -> int:
    shutil.rmtree(HOME, ignore_errors=True)
    HOME.mkdir()
    manifest = HOME / "demo-manifest.toml"
    manifest.write_text(MANIFEST)
    with FakeHub(demo_repos(), trusted_orgs=[ORG]) as hub:
        env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_XET": "1"}
        print(f"demo upstream: {hub.url} (fixture kernel repos of {ORG}); home: {HOME}/")
        ok = step("Stage the manifest (only the chosen variants' files are fetched)", "stage", str(manifest), env=env)
        ok &= step("Rerun: idempotent, nothing downloaded", "stage", str(manifest), env=env)
        ok &= step("Re-hash every blob, check every view link", "verify", env=env)
        ok &= step(f"Availability matrix of {ACT}", "matrix", ACT, env=env)
        ok &= step(
            "The aarch64 trap: v1 for the gh200 target (a refusal, exit 1)",
            "resolve",
            ACT,
            "--version",
            "1",
            "--target",
            "torch2.11-cu130-aarch64-linux",
            env=env,
            expect=1,
        )
        ok &= step(
            "The environment for an x86 CPU node (LOCAL_KERNELS)",
            "env",
            "--target",
            "torch2.13-cpu-x86_64-linux",
            env=env,
        )
        ok &= step("Refusals on record", "report", env=env)
    print("\ndemo " + ("done" if ok else "FAILED"))
    if ok:
        exe = Path(sys.executable).with_name("frt-mirror")
        rel = exe.relative_to(Path.cwd()) if exe.is_relative_to(Path.cwd()) else exe
        home = HOME.relative_to(Path.cwd()) if HOME.is_relative_to(Path.cwd()) else HOME
        print(f"""
Go on by hand (the demo upstream has stopped; everything below reads the staged home):
  {rel} --home {home} matrix {ACT}
  {rel} --home {home} env --target torch2.13-cpu-x86_64-linux      # LOCAL_KERNELS for a node
  {rel} --home {home} bundle kernels.tar                           # to carry across an air gap
  {rel} --home {home} serve --port 8470                            # a Hub endpoint: HF_ENDPOINT=http://127.0.0.1:8470
  {rel} --help""")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
