"""The CLI as a user runs it: the installed `frt-mirror` console script in a subprocess, the environment
it gets, the manifests it is given, and the one line it answers an error with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

EXE = str(Path(sys.executable).with_name("frt-mirror"))
X86 = "torch2.13-cpu-x86_64-linux"  # this machine, so the staged kernels can be loaded here
ARM_CU = "torch2.11-cu130-aarch64-linux"


def cli_env(**extra: str) -> dict[str, str]:
    # FRT_LEDGER_URL passes: it is how a module runs on the PostgreSQL ledger (see conftest.ledger_backend).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FRT_", "HF_")) or k == "FRT_LEDGER_URL"}
    env.update(HF_HUB_DISABLE_XET="1", FRT_RETRY_BASE_WAIT="0.01", PYTHONWARNINGS="ignore")
    env.update(extra)
    return env


def run_cli(
    *args: str, home: Path, env: dict | None = None, wrap: list[str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    """Run the installed `frt-mirror` console script as a user would, in a subprocess."""
    return subprocess.run(
        [*(wrap or []), EXE, "--home", str(home), *args],
        capture_output=True,
        text=True,
        env=env or cli_env(),
        timeout=timeout,
    )


def start_cli(*args: str, home: Path, env: dict | None = None, wrap: list[str] | None = None) -> subprocess.Popen:
    """`run_cli` in the background: the running process, its stdout and stderr piped (text)."""
    argv = [*(wrap or []), EXE, "--home", str(home), *args]
    return subprocess.Popen(argv, env=env or cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_resolve(
    repo: str, version: str, target: str, *extra: str, before: tuple[str, ...] = (), home: Path, **kw
) -> subprocess.CompletedProcess:
    """`frt-mirror [BEFORE] resolve REPO --version VERSION --target TARGET [EXTRA]`."""
    return run_cli(*before, "resolve", repo, "--version", version, "--target", target, *extra, home=home, **kw)


def run_bisect(
    endpoint: str, repo: str, good: str, bad: str, *options: str, target: str, cmd: list[str], home: Path, **kw
) -> subprocess.CompletedProcess:
    """`frt-mirror --endpoint ENDPOINT bisect REPO --good GOOD --bad BAD --target TARGET [OPTIONS] -- CMD`."""
    args = ["--endpoint", endpoint, "bisect", repo, "--good", good, "--bad", bad, "--target", target, *options]
    return run_cli(*args, "--", *cmd, home=home, **kw)


def write_manifest(path: Path, kernels: dict[str, dict], targets: list[str], trust: list[str] | None = None) -> Path:
    lines = [f'[[targets]]\ntarget = "{t}"\n' for t in targets]
    lines.append("[kernels]")
    for repo, spec in kernels.items():
        inner = ", ".join(f"{k} = {json.dumps(v)}" for k, v in spec.items())
        lines.append(f'"{repo}" = {{ {inner} }}')
    if trust is not None:
        lines.append(f"\n[trust]\npublishers = {json.dumps(trust)}")
    path.write_text("\n".join(lines) + "\n")
    return path


def stage_to(store: str, ledger: str, endpoint: str, manifest: Path, *, home: Path, env: dict, json: bool = False):
    """`stage MANIFEST` as a stager host on an object store runs it: the blobs in `store` (s3://…), the
    ledger on the server `ledger` names."""
    args = ["--ledger", ledger, "--store", store, "--endpoint", endpoint, "stage", str(manifest)]
    return run_cli(*args, *(["--json"] if json else []), home=home, env=env)


def stage_json(home, manifest, hub, *extra, env=None):
    p = run_cli("--endpoint", hub.url, "stage", str(manifest), "--json", *extra, home=home, env=env)
    assert p.stdout, p.stderr
    return p, json.loads(p.stdout)


def one_line(p: subprocess.CompletedProcess) -> str:
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("frt-mirror: ") and "Traceback" not in p.stderr, p.stderr
    return lines[0]
