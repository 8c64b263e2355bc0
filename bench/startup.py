"""Start-up: what a command costs before and beside its work, against `python -c "import click"`.

    python -m bench.startup [--runs N]

A small home is staged once (the demo kernels, from the fake Hub, for this box's target) by the installed
`frt-mirror`; then each command below, and the baseline, runs as a child process N times (default 10),
interleaved round by round so that a box's load falls on all alike; each row is the median wall, and the
ratio is the median of the rounds' ratios to the baseline's run beside it. Every child runs with bytecode
written and read (PYTHONDONTWRITEBYTECODE unset), as an installed package has it, after one warm-up run:
the first run of a command compiles what it imports, once per install.

Rows, with the issue's bounds: `--help` and `env --target host --format sh` (each <= 1.5x the baseline;
`host` needs torch on the box, which is detected once and remembered: resolver/host_cache.py), `env` for
a named target (the same bound), and the commands that open the ledger: `report`, `matrix REPO`, `verify`
(each <= 4x).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXE = Path(sys.executable).parent / "frt-mirror"
TARGET = "torch2.13-cpu-x86_64-linux"  # the box's own (CI's): `--target host` names it where torch is 2.13 CPU


def child_env(home: Path, cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FRT_", "HF_"))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return {**env, "FRT_MIRROR_HOME": str(home), "XDG_CACHE_HOME": str(cache), "HF_HUB_DISABLE_XET": "1"}


def stage_home(tmp: Path) -> tuple[Path, str]:
    """Demo kernels staged for TARGET into a fresh home (layernorm brings activation v2, a kernel it
    depends on, beside it: one version each, so env hands off every repo); returns it and one repo to show
    a matrix of."""
    from tests.support.fakehub import FakeHub
    from tests.support.kernel_fixtures import LAYERNORM, ORG, RELU, demo_repos

    home, manifest = tmp / "home", tmp / "m.toml"
    kernels = "\n".join(f'"{r}" = {{ version = 1 }}' for r in (LAYERNORM, RELU))
    trust = f'[trust]\npublishers = ["{ORG}"]\n'
    manifest.write_text(f'[[targets]]\ntarget = "{TARGET}"\n\n[kernels]\n{kernels}\n\n{trust}')
    with FakeHub(demo_repos(), trusted_orgs=[ORG]) as hub:
        p = subprocess.run(
            [str(EXE), "--home", str(home), "--endpoint", hub.url, "stage", str(manifest), "--quiet"],
            capture_output=True,
            text=True,
            env=child_env(home, tmp / "cache"),
            timeout=600,
        )
    if p.returncode:
        sys.exit(f"bench.startup: stage failed:\n{p.stderr}")
    return home, LAYERNORM


def has_torch() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def rows(home: Path, repo: str) -> dict[str, tuple[list[str], float]]:
    """name -> (argv, the issue's bound as a multiple of the baseline)."""
    out: dict[str, tuple[list[str], float]] = {
        'python -c "import click"': ([sys.executable, "-c", "import click"], 1.0),
        "frt-mirror --help": ([str(EXE), "--help"], 1.5),
    }
    if has_torch():
        out["env --target host --format sh"] = ([str(EXE), "env", "--target", "host", "--format", "sh"], 1.5)
    out[f"env --target {TARGET} --format sh"] = ([str(EXE), "env", "--target", TARGET, "--format", "sh"], 1.5)
    out["report"] = ([str(EXE), "report"], 4.0)
    out[f"matrix {repo}"] = ([str(EXE), "matrix", repo], 4.0)
    out["verify"] = ([str(EXE), "verify"], 4.0)
    return out


def measure(cases: dict[str, tuple[list[str], float]], env: dict[str, str], runs: int) -> dict[str, list[float]]:
    walls: dict[str, list[float]] = {name: [] for name in cases}
    for round_ in range(runs + 1):  # round 0 is the warm-up: bytecode written, `host` remembered
        for name, (argv, _) in cases.items():
            t0 = time.perf_counter()
            p = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, timeout=120)
            wall = time.perf_counter() - t0
            if p.returncode:
                sys.exit(f"bench.startup: {name} exited {p.returncode}: {p.stderr.strip()}")
            if round_:
                walls[name].append(wall)
    return walls


def report(cases: dict[str, tuple[list[str], float]], walls: dict[str, list[float]]) -> bool:
    base_name = next(iter(cases))
    base = walls[base_name]
    ok = True
    print(f"{'command':44s} {'median':>9s} {'x baseline':>11s} {'bound':>7s}")
    for name, (_, bound) in cases.items():
        ratio = statistics.median(w / b for w, b in zip(walls[name], base, strict=True))
        passed = name == base_name or ratio <= bound
        ok &= passed
        mark = "" if name == base_name else ("ok" if passed else "OVER")
        print(f"{name:44s} {statistics.median(walls[name]) * 1000:7.1f}ms {ratio:10.2f}x {bound:6.1f}x {mark}")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="frt-startup-") as tmp:
        home, repo = stage_home(Path(tmp))
        cases = rows(home, repo)
        walls = measure(cases, child_env(home, Path(tmp) / "cache"), args.runs)
        print(f"start-up, median of {args.runs} interleaved runs each (a small staged home; {os.cpu_count()} cores)")
        ok = report(cases, walls)
    if not has_torch():
        print("env --target host: not measured (no torch here: `host` needs torch on the box)")
    print("all within bounds" if ok else "some rows are over their bound")


if __name__ == "__main__":
    main()
