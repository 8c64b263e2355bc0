"""`make demo`: the main job on an embedded default. `make try`: the demo upstream, kept running.

`make demo` starts a demo upstream (a fake Hub serving the project's own fixture kernel repos), then
runs the real `frt-mirror` CLI against it, as an operator would on a connected box:
stage a manifest for two targets, verify the store, print the availability matrix and the
cluster's environment, and show the refusal the aarch64 trap produces.

`make try` (python -m tests.demo try) starts the same upstream and keeps it up until Ctrl-C, with a
manifest that names its kernels, so the README's quickstarts can be followed on a box with no internet.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
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
    """One command, its title and what it said, in order, on stdout: a log of the demo reads whole
    (its diagnostics and refusals are stderr's, which a log kept apart from the step they belong to)."""
    print(f"\n## {title}\n$ frt-mirror {' '.join(args)}", flush=True)
    exe = Path(sys.executable).with_name("frt-mirror")
    rc = subprocess.run([str(exe), "--home", str(HOME), *args], env=env, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        print(f"(exit {rc}{', as expected' if rc == expect else f', expected {expect}'})", flush=True)
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
Go on by hand (the demo upstream has stopped; everything below reads the staged home; `make try`
keeps one up, for stage and scan):
  {rel} --home {home} matrix {ACT}
  {rel} --home {home} env --target torch2.13-cpu-x86_64-linux      # LOCAL_KERNELS for a node
  {rel} --home {home} bundle kernels.tar                           # to carry across an air gap
  {rel} --home {home} serve --port 8470                            # a Hub endpoint: HF_ENDPOINT=http://127.0.0.1:8470
  {rel} --help""")
    return 0 if ok else 1


TRY_PORT = 8471  # fixed, so the README's commands can name it; another is taken if it is busy


def _port() -> int:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", TRY_PORT))
            return TRY_PORT
        except OSError:
            return 0


def try_upstream() -> int:
    """The demo upstream until Ctrl-C (or SIGTERM), and what to type against it."""
    manifest = Path("demo-manifest.toml").absolute()
    manifest.write_text(MANIFEST)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):  # SIGINT too where a shell started this in the background
        signal.signal(sig, lambda *_: stop.set())
    hub = FakeHub(demo_repos(), trusted_orgs=[ORG])
    url = hub.start(port=_port())
    bin_dir = Path(sys.executable).parent
    print(
        f"""demo upstream: {url}  (the fixture kernels of {ORG}, as the Hub serves them; Ctrl-C stops it)
manifest that names its kernels: {manifest}

In another shell, from this folder, every README quickstart command works against it:
  export PATH="{bin_dir}:$PATH"    # where make installed frt-mirror
  export HF_ENDPOINT={url}         # or: frt-mirror --endpoint {url} COMMAND
  export FRT_MIRROR_HOME=$PWD/try-home
  frt-mirror stage {manifest.name}
  frt-mirror verify
  frt-mirror matrix {ACT}
  frt-mirror bundle kernels.tar""",
        flush=True,
    )
    stop.wait()
    hub.stop()
    print("demo upstream stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(try_upstream() if sys.argv[1:] == ["try"] else main())
