"""The CLI under fuzz (issue 27, item 8): whatever value an option, an environment variable or a manifest
integer gets (huge integers, NaN, inf, odd URLs, unicode, controls), frt-mirror exits 0, 1, 2 or 3, never
with a traceback, and a refusal of bad input (2) is one line on stderr.

In-process through click's CliRunner, for speed (a subprocess per example costs ~0.3 s); the upstream is a
dead port, so what passes the gate fails fast as "unavailable" (3), and `serve` is stubbed so that a valid
set of options returns instead of serving.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from frt.cli import cli
from tests.support.kernel_fixtures import ORG

REPO = f"{ORG}/relu"
TARGET = "torch2.13-cpu-x86_64-linux"
CONTRACT = {0, 1, 2, 3}

HOSTILE = [
    "9" * 20,
    "9" * 5000,
    "-1",
    "0",
    "1e400",
    "-1e400",
    "nan",
    "inf",
    "-inf",
    "NaN",
    "1_000",
    "0x10",
    " 5 ",
    "",
    " ",
    "\x00",
    "\n",
    "\u202e",
    "٣",
    "é",
    "x" * 300,
    "http://[::1",
    "http://[::1]:8470",
    "http://h:99999",
    "http://h:0",
    "http://h:-1",
    "ftp://h",
    "http://",
    "http://h/x?y#z",
    "postgres-typo@db:5432/frt",
    "postgresql://u@127.0.0.1:9/frt",
    "postgresql://u@[::1/frt",
    "sqlite://",
    "mysql://u@h/d",
    "garbage",
    "file:///etc/passwd",
    "a://b",
    "kernels-test/relu",
    "kernels-test/relu=" + "9" * 20,
    "org/../x",
    "torch2.13-cpu-x86_64-linux",
    "torch99999999999999999999.1-cpu-x86_64-linux",
    "host",
]
# Values that pass an option's own check too, so that examples also reach the code behind it.
PLAIN = [
    "1",
    "2",
    "5",
    "0.5",
    "30",
    "8470",
    "1024",
    "65536",
    "127.0.0.1:9",
    "http://127.0.0.1:9",
    "v1",
    "main",
    REPO,
    f"{REPO}@v1",
    f"{REPO}=1",
    ORG,
    "*",
    TARGET,
]
VALUES = st.one_of(
    st.sampled_from(PLAIN),
    st.one_of(st.sampled_from(HOSTILE), st.integers().map(str), st.floats().map(str), st.text(max_size=40)),
)
# Not the retry settings: a valid FRT_RETRY_ATTEMPTS=10000 would really retry the dead upstream
# (test_cli.py checks their hostile values).
ENV_VARS = [
    "FRT_LEDGER_BUSY_TIMEOUT",
    "FRT_LEDGER_URL",
    "HF_ENDPOINT",
    "FRT_SERVE_MAX_HEADER_BYTES",
    "FRT_SERVE_HEADER_TIMEOUT",
    "FRT_SERVE_KEEP_ALIVE_TIMEOUT",
    "FRT_SERVE_MAX_CONNECTIONS",
    "FRT_SERVE_POLL",
]


def commands(v):
    """argv templates: each takes the fuzzed values (an iterator) where a user types a value."""
    return [
        ["resolve", REPO, "--version", next(v), "--target", TARGET, "--offline"],
        ["resolve", next(v), "--revision", next(v), "--target", next(v), "--offline"],
        ["env", "--target", next(v), "--version", f"{REPO}={next(v)}"],
        ["env", "--serve", next(v)],
        ["matrix", next(v), "--target", next(v)],
        ["scan", next(v), "--jobs", next(v), "--endpoint", next(v)],
        ["--endpoint", next(v), "scan", REPO],
        ["--ledger", next(v), "report"],
        ["stage", "{manifest}", "--target", next(v), "--jobs", next(v)],
        ["serve", "--port", next(v), "--refs-ttl", next(v), "--upstream-timeout", next(v), "--upstream-hold", next(v)],
        [
            "serve",
            "--max-header-bytes",
            next(v),
            "--header-timeout",
            next(v),
            "--keep-alive-timeout",
            next(v),
            "--max-connections",
            next(v),
            "--workers",
            next(v),
        ],
        ["serve", "--upstream", next(v), "--allow", next(v)],
        [
            "bisect",
            REPO,
            "--good",
            next(v),
            "--bad",
            next(v),
            "--target",
            TARGET,
            "--offline",
            "--timeout",
            next(v),
            "--",
            "true",
        ],
        [
            "bisect",
            REPO,
            "--good",
            "a",
            "--bad",
            "b",
            "--target",
            TARGET,
            "--offline",
            "--metric",
            next(v),
            "--repeat",
            next(v),
            "--threshold",
            next(v),
            "--",
            "true",
        ],
        ["nginx-conf", "--upstream", next(v), "--listen", next(v), "--head-cache", next(v)],
        ["unstage", next(v), "--target", next(v)],
        ["token", "add", next(v)],
        ["export-cache", "{out}", "--target", next(v)],
        ["verify"],
        ["report", "--json"],
    ]


MANIFEST = """[[targets]]
target = "{target}"
[kernels]
"{repo}" = {{ version = {version} }}
"""


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cli-fuzz")


@contextlib.contextmanager
def no_serving():
    """serve with valid options returns at once instead of serving until stopped (with --workers too,
    which would fork workers that serve); what serve put in os.environ for its workers is taken back."""
    import frt.cli.serve_cmds as serve_cmds
    import frt.mirror.serve as served
    import frt.mirror.serve.run as run
    import frt.mirror.serve.workers as workers

    saved, saved_workers, saved_stop = run.serve, workers.serve_workers, serve_cmds._stopped
    environ = dict(os.environ)

    def serve(app, sockets, *a, **k):
        for sock in sockets:  # as uvicorn does when it stops: the next case may listen on the same port
            sock.close()
        return run.Stopped(signal=None, in_flight=0)

    def serve_workers(spec, sockets, *a, **k):
        serve(None, sockets)
        return 0, None

    run.serve = served.__dict__["serve"] = serve
    workers.serve_workers = serve_workers
    # serve's real end is os._exit (serve_cmds._stopped), which would end the pytest worker itself
    serve_cmds._stopped = lambda line, code: sys.exit(code)  # type: ignore[assignment]
    try:
        yield
    finally:
        run.serve = served.__dict__["serve"] = saved
        workers.serve_workers = saved_workers
        serve_cmds._stopped = saved_stop  # type: ignore[assignment]
        os.environ.clear()
        os.environ.update(environ)


def _lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(
    which=st.integers(0, 19),
    values=st.lists(VALUES, min_size=8, max_size=8),
    env=st.dictionaries(st.sampled_from(ENV_VARS), VALUES, max_size=2),
    version=st.one_of(st.integers(), st.sampled_from(["1", '"1"', "1e400", "nan", "[[[[1]]]]", "9" * 5000])),
)
def test_every_option_value_is_a_contract_exit_and_one_line(work, which, values, env, version):
    argv = commands(itertools.cycle(values))[which]
    manifest = work / "m.toml"
    manifest.write_text(MANIFEST.format(target=TARGET, repo=REPO, version=version))
    argv = [a.replace("{manifest}", str(manifest)).replace("{out}", str(work / "cache")) for a in argv]
    if any("\x00" in x for x in [*env.values(), *argv]):  # no process can be given a NUL: execve refuses it
        return
    _holds_the_contract(work, argv, env)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_with_valid_options_ends_on_its_stop_line_in_the_fuzz_harness(work, workers):
    """Found by the fuzz test in CI: with valid options, the harness's stand-in serve must end the way
    serve does (a Stopped, then the stop line), not raise inside the CLI."""
    result = _holds_the_contract(work, ["serve", "--upstream", "", "--allow", "8027", "--workers", workers], {})
    assert result.exit_code == 0, result.stderr


def _holds_the_contract(work: Path, argv: list[str], env: dict[str, str]):
    base = {
        "HF_ENDPOINT": "http://127.0.0.1:9",
        "FRT_RETRY_ATTEMPTS": "1",
        "FRT_RETRY_BASE_WAIT": "0.01",
        "FRT_LEDGER_CONNECT_TIMEOUT": "1",
        "FRT_LEDGER_RETRY_S": "0",
        "FRT_LEDGER_URL": None,
        "FRT_MIRROR_HOME": None,
    }
    cwd = work / "cwd"
    cwd.mkdir(exist_ok=True)
    with no_serving(), contextlib.chdir(cwd) if hasattr(contextlib, "chdir") else _chdir(cwd):
        result = CliRunner().invoke(
            cli,
            ["--home", str(work / "home"), *argv],
            env={**base, **env},
            prog_name="frt-mirror",
            catch_exceptions=True,
        )
    stderr = result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit), (argv, env, result.exc_info)
    assert result.exit_code in CONTRACT, (argv, env, result.exit_code, stderr)
    assert "Traceback" not in stderr and "Traceback" not in result.stdout, (argv, env, stderr)
    if result.exit_code == 2:
        lines = _lines(stderr)
        assert len(lines) == 1 and lines[0].startswith("frt-mirror: "), (argv, env, stderr)
    elif result.exit_code:
        assert _lines(stderr) and _lines(stderr)[-1].startswith("frt-mirror: "), (argv, env, stderr)
    assert not [p for p in cwd.iterdir()], (argv, env, list(cwd.iterdir()))  # nothing named after a bad value
    return result


@contextlib.contextmanager
def _chdir(path: Path):  # contextlib.chdir is Python 3.11+
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)
