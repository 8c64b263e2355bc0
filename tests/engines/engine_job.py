"""What both engines' tests share: frt reaches an engine job only the way it reaches a read-only cluster.

The pytest process never imports frt (at the repository root, ``frt/`` holds only the namespace's
``__init__``; the subpackages are mapped by pyproject's package-dir). `prepare` stages the fixture
kernels for the engine venv's host target with the real CLI from a fake Hub that is stopped
afterwards, then runs ``frt-mirror env --engine <engine>``, which writes the PYTHONPATH directory
(frt and the plugin's dist-info) that every engine run gets.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def source_tree(dest: Path) -> Path:
    """The frt package laid out as a wheel lays it out (pyproject's package-dir), as symlinks into this
    checkout: what the CLI runs from before it writes the real PYTHONPATH directory."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        dirs = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    (dest / "frt").mkdir(parents=True)
    for name, rel in dirs.items():
        if name == "frt":  # the root's modules and the packages that live inside it (frt.cli)
            for module in (ROOT / rel).glob("*.py"):
                (dest / "frt" / module.name).write_bytes(module.read_bytes())
            for sub in (ROOT / rel).iterdir():
                if (sub / "__init__.py").is_file():
                    (dest / "frt" / sub.name).symlink_to(sub, target_is_directory=True)
        else:
            (dest / "frt" / name.split(".", 1)[1]).symlink_to(ROOT / rel, target_is_directory=True)
    return dest


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without anything frt, an engine or the Hub would read from it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FRT_", "VLLM_", "SGLANG_", "HF_", "PYTHONPATH"))}
    env.update(HF_HUB_DISABLE_XET="1", PYTHONWARNINGS="ignore")
    env.update(extra)
    return env


def frt_cli(src: Path, *args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    code = "import sys; from frt.cli import main; sys.argv[0] = 'frt-mirror'; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=clean_env(PYTHONPATH=str(src)),
        timeout=timeout,
    )


@dataclass
class Prepared:
    src: Path  # frt from this checkout, for the CLI (and SGLang's install())
    home: Path  # the staged mirror home
    env_doc: dict  # what `frt-mirror env --engine <engine> --format json` printed

    def env(self, overrides: dict[str, str | None], **base: str) -> dict[str, str]:
        """The job's environment: ``base``, then what `frt-mirror env` printed, then ``overrides``
        (None removes a key)."""
        env = clean_env(**base, **self.env_doc["env"])
        for k, v in overrides.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        return env


def prepare(root: Path, engine: str, repos: tuple[str, ...], catalog: Path) -> Prepared:
    from tests.support.fakehub import FakeHub
    from tests.support.kernel_fixtures import ORG
    from tests.support.seat_fixtures import seat_repos, write_stage_manifest

    src = source_tree(root / "src")
    p = subprocess.run(
        [sys.executable, "-c", "from frt.resolver.targets import host_target; print(host_target())"],
        cwd=root,
        capture_output=True,
        text=True,
        env=clean_env(PYTHONPATH=str(src)),
    )
    assert p.returncode == 0, p.stderr
    home = root / "home"
    with FakeHub(seat_repos(), trusted_orgs=[ORG]) as hub:
        manifest = write_stage_manifest(root / "stage.toml", p.stdout.strip(), repos)
        p = frt_cli(src, "--home", str(home), "--endpoint", hub.url, "stage", str(manifest), cwd=root)
    assert p.returncode == 0, f"staging failed:\n{p.stdout}\n{p.stderr}"
    p = frt_cli(
        src,
        "--home",
        str(home),
        "env",
        "--engine",
        engine,
        "--seats",
        str(catalog),
        "--python-dir",
        str(root / "python"),
        "--format",
        "json",
        cwd=root,
    )
    assert p.returncode == 0, f"frt-mirror env --engine {engine} failed:\n{p.stdout}\n{p.stderr}"
    return Prepared(src, home, json.loads(p.stdout))
