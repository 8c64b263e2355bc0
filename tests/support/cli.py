"""The CLI as a user runs it: the `frt-mirror` command, the environment it gets, the manifests it is given,
and the one line it answers an error with.

`run_cli` runs the command in this process, through the same click group and `main` settings the
console script calls (frt/cli/__init__.py), in the environment `cli_env` gives a process: what a process
proves about a command's output and exit code, in milliseconds rather than a second of start-up.
`run_cli_process` runs the installed console script in a subprocess, for what only a process shows: a
wrap around it (`unshare -n`, `unshare -m`), its start-up, a variable read when a library is imported,
output written to its file descriptors by the programs it starts. `start_cli` is always a process."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import traceback
from collections.abc import Iterator, Mapping
from pathlib import Path

from click import formatting
from click.testing import CliRunner

EXE = str(Path(sys.executable).with_name("frt-mirror"))
X86 = "torch2.13-cpu-x86_64-linux"  # this machine, so the staged kernels can be loaded here
ARM_CU = "torch2.11-cu130-aarch64-linux"

# Variables read once, as an interpreter starts (PYTHON*, LD_*) or as huggingface_hub is imported (its
# constants: HF_HUB_OFFLINE, HF_HOME, timeouts...): a command run in this process sees them as this process
# started, whatever its env says. Taken here, while conftest loads, before any test can set one.
_AT_START = ("HF_", "PYTHON", "LD_")
_STARTED_WITH = {k: v for k, v in os.environ.items() if k.startswith(_AT_START)}
# Those read at call time, or read at start-up by nothing a command's answer depends on:
_READ_LATE = {
    "HF_TOKEN",  # huggingface_hub's get_token() reads it per request
    "HF_HUB_DISABLE_XET",  # only hf_hub_download reads it: frt downloads through its own transport
    "PYTHONWARNINGS",  # 'ignore' in a process; here pytest records warnings: stderr has none either way
}


def cli_env(**extra: str) -> dict[str, str]:
    # FRT_LEDGER_URL passes: it is how a module runs on the PostgreSQL ledger (see conftest.ledger_backend).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FRT_", "HF_")) or k == "FRT_LEDGER_URL"}
    env.update(HF_HUB_DISABLE_XET="1", FRT_RETRY_BASE_WAIT="0.01", PYTHONWARNINGS="ignore")
    env.update(extra)
    return env


def run_cli(
    *args: str, home: Path, env: dict | None = None, wrap: list[str] | None = None
) -> subprocess.CompletedProcess:
    """`frt-mirror --home HOME ARGS` in this process, its answer as a subprocess's: the exit code, stdout
    and stderr (text, newlines translated). With `wrap` (`unshare -n`...), the console script in a
    process inside it: a wrap is a process's."""
    if wrap:
        return run_cli_process(*args, home=home, env=env, wrap=wrap)
    return _invoke(["--home", str(home), *args], env or cli_env())


def run_cli_process(
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
    """`run_cli_process` in the background: the running process, its stdout and stderr piped (text)."""
    argv = [*(wrap or []), EXE, "--home", str(home), *args]
    return subprocess.Popen(argv, env=env or cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _invoke(argv: list[str], env: Mapping[str, str]) -> subprocess.CompletedProcess:
    """The command as the console script runs it (`main`: the group `cli`, prog_name frt-mirror, click's
    standalone mode), in `env` exactly (variables it lacks unset), with what a process starts and ends
    without: huggingface_hub's shared session (its pooled connections) closed before and after, and any
    variable the command set itself (serve sets its limits for its workers) undone after."""
    from huggingface_hub import close_session

    from frt.cli import cli

    late = [k for k in {*env, *_STARTED_WITH} if k.startswith(_AT_START) and k not in _READ_LATE]
    if fixed := sorted(k for k in late if env.get(k) != _STARTED_WITH.get(k)):
        raise AssertionError(f"{', '.join(fixed)}: read as a process starts; use run_cli_process for this run")
    changes: dict[str, str | None] = {k: v for k, v in env.items() if os.environ.get(k) != v}
    changes.update((k, None) for k in os.environ if k not in env)
    before = dict(os.environ)
    close_session()
    try:
        result = _Runner().invoke(cli, argv, env=changes, prog_name="frt-mirror", catch_exceptions=True)
    finally:
        close_session()
        for k in [k for k in os.environ if k not in before]:
            del os.environ[k]
        os.environ.update(before)
    stderr = result.stderr_bytes
    if result.exception is not None and not isinstance(result.exception, SystemExit):  # as Python prints it
        stderr += "".join(traceback.format_exception(result.exception)).encode()
    out, err = _text(result.stdout_bytes), _text(stderr)
    return subprocess.CompletedProcess(["frt-mirror", *argv], result.exit_code, out, err)


def _text(data: bytes) -> str:
    """What `subprocess.run(text=True)` reads: decoded, with universal newlines (a bar's \\r too)."""
    return data.decode().replace("\r\n", "\n").replace("\r", "\n")


class _Runner(CliRunner):
    """click's CliRunner (sys.stdin, sys.stdout and sys.stderr replaced; os.environ set for the call),
    and two things it leaves as the test process has them, set as a piped process has them: the help's
    width and where a logged warning goes."""

    @contextlib.contextmanager
    def isolation(self, *args: object, **kwargs: object) -> Iterator[tuple]:
        outer = sys.stderr
        with super().isolation(*args, **kwargs) as streams:  # type: ignore[arg-type]
            # shutil.get_terminal_size() of a pipe: $COLUMNS, else 80; click's help takes 2 less, at least 50
            columns = int(os.environ.get("COLUMNS") or 0) or 80
            formatting.FORCED_WIDTH = max(min(columns, 80) - 2, 50)
            with _logging_to(outer, sys.stderr):
                yield streams


@contextlib.contextmanager
def _logging_to(outer: object, captured: object) -> Iterator[None]:
    """Log records as a process without logging set up prints them: a warning with no handler of its own
    reaches stderr through logging.lastResort (pytest's handlers on the root logger keep it from firing
    here), and a library's StreamHandler on stderr (huggingface_hub's) writes to the command's stderr,
    not the one it was made with (a StreamHandler keeps the stream it was given). The verbosity the CLI
    sets huggingface_hub's logger to (cli/app.py) is its process's: not left to the tests after it."""
    root, hf = logging.getLogger(), logging.getLogger("huggingface_hub")
    hf_level = hf.level
    on_stderr = _stream_handlers(outer, sys.__stderr__)
    for h in on_stderr:
        h.setStream(captured)  # type: ignore[arg-type]
    last_resort = logging.lastResort
    if last_resort is not None:
        root.addHandler(last_resort)
    try:
        yield
    finally:
        hf.setLevel(hf_level)
        if last_resort is not None:
            root.removeHandler(last_resort)
        # huggingface_hub makes its handler on first use: maybe in here, on the captured stream
        for h in {*on_stderr, *_stream_handlers(captured)}:
            h.setStream(outer)  # type: ignore[arg-type]


def _stream_handlers(*streams: object) -> list[logging.StreamHandler]:
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    handlers = (h for lg in loggers if isinstance(lg, logging.Logger) for h in lg.handlers)
    return [h for h in handlers if type(h) is logging.StreamHandler and any(h.stream is s for s in streams)]


def run_resolve(
    repo: str, version: str, target: str, *extra: str, before: tuple[str, ...] = (), home: Path, **kw
) -> subprocess.CompletedProcess:
    """`frt-mirror [BEFORE] resolve REPO --version VERSION --target TARGET [EXTRA]`."""
    return run_cli(*before, "resolve", repo, "--version", version, "--target", target, *extra, home=home, **kw)


def run_bisect(
    endpoint: str, repo: str, good: str, bad: str, *options: str, target: str, cmd: list[str], home: Path, **kw
) -> subprocess.CompletedProcess:
    """`frt-mirror --endpoint ENDPOINT bisect REPO --good GOOD --bad BAD --target TARGET [OPTIONS] -- CMD`,
    in a process: bisect hands CMD its own stderr's file descriptor (mirror/bisect/by_revision.py), which
    only a process has to give (in here it would be the test process's, not the command's captured one)."""
    args = ["--endpoint", endpoint, "bisect", repo, "--good", good, "--bad", bad, "--target", target, *options]
    return run_cli_process(*args, "--", *cmd, home=home, **kw)


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


def stage_json(home, manifest, hub, *extra, env=None, run=run_cli):
    p = run("--endpoint", hub.url, "stage", str(manifest), "--json", *extra, home=home, env=env)
    assert p.stdout, p.stderr
    return p, json.loads(p.stdout)


def one_line(p: subprocess.CompletedProcess) -> str:
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("frt-mirror: ") and "Traceback" not in p.stderr, p.stderr
    return lines[0]
