"""The engine adapters' environment: `frt-mirror env --engine`, the PYTHONPATH dist-info, FRT_SEATS.

The real engines run in tests/engines (their own venv); here, in the main venv, the parts that need
no engine: what the CLI prints and writes, that a clean interpreter finds the plugin entry points
through PYTHONPATH alone, and `frt.adapters.common.attach_from_env` on a tiny transformers model.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from frt.manifests import EXAMPLES
from tests.support.cli import cli_env, run_cli

VLLM_CATALOG = EXAMPLES / "seats-vllm.toml"


def exports(stdout: str) -> dict[str, str]:
    import shlex

    out = {}
    for line in stdout.splitlines():
        if line.startswith("export "):
            key, _, value = line[len("export ") :].partition("=")
            out[key] = shlex.split(value)[0]
    return out


def test_env_engine_vllm_prints_the_no_install_route(home, tmp_path):
    p = run_cli("env", "--engine", "vllm", "--seats", str(VLLM_CATALOG), home=home)
    assert p.returncode == 0, p.stderr
    values = exports(p.stdout)
    python_dir = home.absolute() / "python"
    assert values == {
        "PYTHONPATH": str(python_dir),
        "FRT_MIRROR_HOME": str(home.absolute()),
        "FRT_SEATS": str(VLLM_CATALOG.absolute()),
        "VLLM_PLUGINS": "frt",
        "VLLM_DISABLE_COMPILE_CACHE": "1",
    }
    (info,) = python_dir.glob("frt_mirror_adapters-*.dist-info")
    assert "[vllm.general_plugins]\nfrt = frt.adapters.vllm_engine:register" in (info / "entry_points.txt").read_text()
    for sub in ("cli", "resolver", "mirror", "seats", "adapters", "manifests"):
        assert (python_dir / "frt" / sub / "__init__.py").is_file()
    assert (python_dir / "frt" / "__init__.py").is_file() and (python_dir / "frt" / "resolver" / "fs.py").is_file()
    assert (python_dir / "frt" / "manifests" / "examples" / "seats-vllm.toml").is_file()  # package data too
    assert not list(python_dir.rglob("__pycache__"))


def test_pythonpath_dir_alone_provides_frt_and_the_entry_points(home, tmp_path):
    """A fresh interpreter, run from elsewhere, finds both plugins and imports frt from the directory
    (not from this checkout's editable install): what a read-only cluster mount gets."""
    p = run_cli("env", "--engine", "vllm", "--format", "json", home=home)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    python_dir = Path(doc["python_dir"])
    assert doc["engine"] == "vllm" and doc["env"]["PYTHONPATH"] == str(python_dir)
    code = """if True:
        import json
        from importlib.metadata import entry_points
        found = {g: [(e.name, e.value, e.dist.name) for e in entry_points(group=g)]
                 for g in ("vllm.general_plugins", "sglang.srt.plugins")}
        register = entry_points(group="vllm.general_plugins")["frt"].load()
        import frt.adapters.vllm_engine as v
        import frt.adapters.common as c  # what a worker runs on attach: it needs frt.resolver.fs
        print(json.dumps({"found": found, "file": v.__file__, "same": register is v.register,
                          "common": c.__file__}))
    """
    env = {k: v for k, v in cli_env().items() if k != "PYTHONPATH"}
    run = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": str(python_dir)},
    )
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    assert ("frt", "frt.adapters.vllm_engine:register", "frt-mirror-adapters") in [
        tuple(e) for e in got["found"]["vllm.general_plugins"]
    ]
    assert ("frt", "frt.adapters.sglang_engine:register", "frt-mirror-adapters") in [
        tuple(e) for e in got["found"]["sglang.srt.plugins"]
    ]
    assert got["file"].startswith(str(python_dir)) and got["same"]
    assert got["common"].startswith(str(python_dir))


def test_env_engine_sglang_and_rewrite(home):
    for _ in range(2):  # written again in place: the old copy swapped out, nothing left behind
        p = run_cli("env", "--engine", "sglang", home=home)
        assert p.returncode == 0, p.stderr
    values = exports(p.stdout)
    assert values["SGLANG_PLUGINS"] == "frt" and "VLLM_PLUGINS" not in values and "FRT_SEATS" not in values
    assert "set FRT_SEATS=" in p.stdout  # says how to turn seats on
    assert sorted(q.name for q in home.iterdir() if q.name.startswith((".python", "python"))) == ["python"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--engine", "vllm", "--seats", "missing.toml"], "no such file"),
        (["--seats", str(VLLM_CATALOG)], "--seats and --python-dir go with --engine"),
        (["--engine", "gpu"], "Invalid value for '--engine'"),
    ],
)
def test_env_engine_bad_input(home, args, message):
    p = run_cli("env", *args, home=home)
    assert p.returncode == 2 and message in p.stderr, p.stderr


def test_env_engine_rejects_a_bad_catalog(home, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[[seats]]\nkind = "activation"\nmatch = ["mlp.act_fn"]\n')
    p = run_cli("env", "--engine", "vllm", "--seats", str(bad), home=home)
    assert p.returncode == 2 and "bad.toml" in p.stderr and "kernel" in p.stderr, p.stderr
    assert not (home / "python").exists()  # nothing written for a catalog the engine would reject


# --- attach_from_env: what every engine hook calls in its worker ----------------------------------------


def test_attach_from_env_is_a_no_op_without_frt_seats():
    from frt.adapters.common import attach_from_env
    from tests.support.seat_fixtures import tiny_qwen3

    model = tiny_qwen3()
    assert attach_from_env(model, "sglang", environ={}) is None
    assert attach_from_env(model, "sglang", environ={"FRT_SEATS": ""}) is None


def test_attach_from_env_seats_logs_and_marks(seats_home, tmp_path, caplog):
    from frt.adapters.common import attach_from_env, handles
    from tests.support.seat_fixtures import tiny_qwen3

    model = tiny_qwen3()
    env = {
        "FRT_SEATS": str(EXAMPLES / "seats-qwen3.toml"),
        "FRT_MIRROR_HOME": str(seats_home),
        "FRT_SEATS_MARKER_DIR": str(tmp_path / "markers"),
    }
    before = len(handles("test-engine"))
    with caplog.at_level(logging.INFO, logger="frt"):
        handle = attach_from_env(model, "test-engine", environ=env)
    assert handle is not None and handles("test-engine")[before:] == [handle]
    (line,) = [r.getMessage() for r in caplog.records if r.name == "frt.test-engine"]
    n = len(handle.records)
    assert line.startswith(f"[frt.test-engine] {n} seats (") and line.endswith(", 0 refused")
    assert "catalog seats-qwen3.toml" in line and f"{handle.head_slabs} head slabs" in line
    marker = json.loads((tmp_path / "markers" / f"test-engine-{os.getpid()}.json").read_text())
    assert marker["pid"] == os.getpid() and marker["engine"] == "test-engine" and marker["refused"] == []
    assert sorted(s["site"] for s in marker["seats"]) == sorted(r.site for r in handle.records)
    handle.detach()


def test_attach_from_env_strict_and_bad_input(seats_home, tmp_path):
    from frt.adapters.common import attach_from_env
    from frt.resolver.errors import BadInput
    from frt.seats import SeatsRefused
    from tests.support.seat_fixtures import tiny_qwen3

    env = {"FRT_SEATS": str(VLLM_CATALOG), "FRT_MIRROR_HOME": str(seats_home)}
    # The vLLM catalog seats mlp.act_fn with silu_and_mul, which halves the width: parity refuses it
    # on a transformers model, whose act_fn is a plain SiLU.
    handle = attach_from_env(tiny_qwen3(), "test-engine", environ=env)
    assert handle.records == [] and len(handle.notes["refused"]) == 2
    with pytest.raises(SeatsRefused):
        attach_from_env(tiny_qwen3(), "test-engine", environ={**env, "FRT_SEATS_STRICT": "1"})
    with pytest.raises(BadInput, match="FRT_SEATS_STRICT='maybe'"):
        attach_from_env(tiny_qwen3(), "test-engine", environ={**env, "FRT_SEATS_STRICT": "maybe"})
    with pytest.raises(BadInput, match="FRT_SEATS=.*nope.toml"):
        attach_from_env(tiny_qwen3(), "test-engine", environ={**env, "FRT_SEATS": str(tmp_path / "nope.toml")})
