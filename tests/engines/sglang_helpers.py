"""The SGLang engine tests' job: a staged home and the PYTHONPATH route (tests/engines/engine_job.py),
and a way to run a probe in a fresh interpreter with that environment."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.engines.engine_job import HERE, ROOT, Prepared
from tests.engines.engine_job import prepare as prepare_engine

__all__ = ["HERE", "SGLangJob", "prepare", "read_json", "run_py"]
CATALOG = ROOT / "manifests" / "examples" / "seats-qwen3.toml"


def run_py(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """This venv's python, one stream (SGLang logs to stdout, frt to stderr: the tests read both)."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )


@dataclass
class SGLangJob:
    root: Path
    prepared: Prepared

    @property
    def env_doc(self) -> dict:
        return self.prepared.env_doc

    def env(self, **overrides: str | None) -> dict[str, str]:
        """The job's environment: `frt-mirror env` output, offline, plus the test fixtures (the probes
        import tests.support.seat_fixtures) after frt's directory; None removes a key. The fixtures come
        through a folder holding only a link to tests/: the checkout's root would also bring its egg-info,
        a second declaration of the same entry point."""
        env = self.prepared.env(overrides, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
        if "PYTHONPATH" not in overrides:
            env["PYTHONPATH"] = f"{self.env_doc['env']['PYTHONPATH']}:{self.root / 'fixtures-path'}"
        return env


def prepare(root: Path) -> SGLangJob:
    """The fixture kernels the Qwen3 catalog names, staged for this venv's host target (its torch
    decides it), and `frt-mirror env --engine sglang`."""
    from tests.support.seat_fixtures import ACTIVATION, EXPERTS, LINEAR, RMSNORM

    (root / "fixtures-path").mkdir()
    (root / "fixtures-path" / "tests").symlink_to(ROOT / "tests", target_is_directory=True)
    return SGLangJob(root, prepare_engine(root, "sglang", (RMSNORM, ACTIVATION, LINEAR, EXPERTS), CATALOG))


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())
