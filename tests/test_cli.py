"""The frt-mirror CLI as a user runs it: exit codes, one-line errors, --json (in this process, or a subprocess
where a process is the point: a network namespace, an environment read at start-up)."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.cli import cli_env, run_cli, run_cli_process, run_resolve
from tests.support.kernel_fixtures import ACTIVATION, RELU

pytestmark = pytest.mark.hub1

NO_NET = ["unshare", "-n"]


def needs_unshare():
    if shutil.which("unshare") is None or subprocess.run([*NO_NET, "true"]).returncode != 0:
        pytest.fail("unshare -n is required for air-gap tests (CI runs as root)")


def one_line_error(p: subprocess.CompletedProcess) -> str:
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert lines[0].startswith("frt-mirror: ")
    return lines[0]


def test_scan_resolve_matrix_report(hub, home):
    p = run_cli("--endpoint", hub.url, "scan", ACTIVATION, RELU, home=home)
    assert p.returncode == 0, p.stderr
    assert ACTIVATION in p.stdout and RELU in p.stdout

    # The endpoint is accepted after the command too.
    p = run_resolve(ACTIVATION, "2", "torch2.11-cu130-aarch64-linux", "--endpoint", hub.url, "--json", home=home)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["variant"] == "torch211-cxx11-cu130-aarch64-linux" and doc["archs"] == ["8.0", "9.0", "10.0"]
    assert len(doc["commit"]) == 40 and all(f["git_oid"] for f in doc["files"])

    p = run_resolve(ACTIVATION, "1", "torch2.11-cu130-aarch64-linux", before=("--endpoint", hub.url), home=home)
    assert p.returncode == 1
    line = one_line_error(p)
    assert "none for torch2.11-cu130-aarch64-linux; newest commit on v1 with it:" in line and "v2 has it" in line

    p = run_cli("matrix", ACTIVATION, "--json", home=home)
    assert p.returncode == 0, p.stderr
    m = json.loads(p.stdout)
    assert len(m["revisions"]) == 6 and "torch2.11-cu130-aarch64-linux" in m["targets"]
    served = [r["serves"]["torch2.11-cu130-aarch64-linux"] for r in m["revisions"]]
    assert served.count(None) == 3  # two old v1 commits and the v1 head lack it
    p = run_cli("matrix", ACTIVATION, "--target", "torch2.13-cpu-aarch64-linux", home=home)
    assert p.returncode == 0 and "torch2.13-cpu-aarch64-linux" in p.stdout

    p = run_cli("report", "--json", home=home)
    rows = json.loads(p.stdout)
    assert [(r["repo"], r["requested"], r["target"], r["error"]) for r in rows] == [
        (ACTIVATION, "v1", "torch2.11-cu130-aarch64-linux", "NoVariant")
    ]
    assert "torch-cpu: backend (cpu) does not match system backend (cuda) and is not universal" in rows[0]["detail"]
    assert len(run_cli("report", home=home).stdout.splitlines()) == 3  # header, rule, one refusal


def test_refusal_json_goes_to_stdout(hub, home):
    p = run_resolve(ACTIVATION, "9", "host", "--json", before=("--endpoint", hub.url), home=home)
    assert p.returncode == 1
    assert json.loads(p.stdout)["error"] == "VersionNotFound"


def test_pin_from_the_environment(hub, home):
    repo = hub.repos[("kernel", ACTIVATION)]
    old = repo.history(repo.branches["v1"])[-1].sha
    env = cli_env(FRT_KERNEL_REV_KERNELS_TEST_ACTIVATION=old)
    p = run_resolve(
        ACTIVATION, "2", "torch2.13-cpu-x86_64-linux", "--json", before=("--endpoint", hub.url), home=home, env=env
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["commit"] == old and json.loads(p.stdout)["requested"] == f"pin {old}"


@pytest.mark.parametrize(
    "args, needle",
    [
        (["resolve", ACTIVATION, "--version", "1", "--target", "torch2.11-cuda-x86_64-linux"], "unknown backend"),
        (["resolve", ACTIVATION, "--version", "1", "--target", "linux"], "unknown target 'linux'"),
        (["resolve", "not a repo", "--version", "1", "--target", "host"], "malformed repo id"),
        (["resolve", ACTIVATION, "--target", "host"], "exactly one of a version or a revision"),
        (["resolve", ACTIVATION, "--version", "1", "--revision", "v1", "--target", "host"], "not both"),
        (["scan", "../../etc"], "malformed repo id"),
        (["matrix", ACTIVATION], "no frt-mirror home at"),  # a reading command, and this home is new
    ],
)
def test_bad_input_is_one_line_and_exit_2(home, args, needle):
    p = run_cli("--endpoint", "http://127.0.0.1:9", *args, home=home)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert needle in one_line_error(p)


def test_dead_upstream_is_one_line(home):
    env = cli_env(FRT_RETRY_ATTEMPTS="2")
    p = run_cli("--endpoint", "http://127.0.0.1:9", "scan", ACTIVATION, home=home, env=env)
    assert p.returncode == 3  # try again later: not bad input
    assert "upstream http://127.0.0.1:9 unreachable after 2 attempts" in one_line_error(p)


@pytest.mark.parametrize(
    "args",
    [("report",), ("report", "--json"), ("matrix", ACTIVATION), ("env", "--target", "torch2.13-cpu-x86_64-linux")],
)
def test_a_reader_that_goes_away_ends_the_command_quietly_as_141(hub, home, args):
    """`frt-mirror … | head`: the reader closed stdout before the first write. Exit 141, as a shell gives a
    writer killed by SIGPIPE, and nothing on stderr (it was `frt-mirror: Broken pipe`, exit 2)."""
    from tests.support.cli import EXE, X86, stage_json, write_manifest

    stage_json(home, write_manifest(home.parent / "m.toml", {ACTIVATION: {"version": 1}}, [X86]), hub)

    script = '"$EXE" --home "$HOMEDIR" "$@" | (exec 0<&-; sleep 0.2); echo "${PIPESTATUS[0]}"'
    env = cli_env(EXE=EXE, HOMEDIR=str(home))
    p = subprocess.run(["bash", "-c", script, "sh", *args], capture_output=True, text=True, env=env, timeout=60)
    assert (p.stdout.strip(), p.stderr) == ("141", ""), (p.stdout, p.stderr)


def test_corrupt_ledger_is_one_line(home):
    home.mkdir(parents=True)
    (home / "ledger.sqlite").write_bytes(b"this is not a database" * 100)
    p = run_cli("report", home=home)
    assert p.returncode == 2
    assert "cannot be opened" in one_line_error(p)
    assert (home / "ledger.sqlite").read_bytes().startswith(b"this is not"), "nothing stored is overwritten"


def test_resolve_offline_answers_from_the_ledger_with_no_network(hub, home):
    needs_unshare()
    assert run_cli("--endpoint", hub.url, "scan", ACTIVATION, home=home).returncode == 0
    p = run_resolve(ACTIVATION, "1", "torch2.13-cpu-x86_64-linux", "--offline", "--json", home=home, wrap=NO_NET)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["variant"] == "torch213-cxx11-cpu-x86_64-linux"
    # The same refusal as online, from the ledger alone.
    p = run_resolve(ACTIVATION, "1", "torch2.11-cu130-aarch64-linux", "--offline", home=home, wrap=NO_NET)
    assert p.returncode == 1 and "v2 has it" in one_line_error(p)
    # Without --offline, the missing network is one clear line, not a traceback.
    p = run_resolve(
        ACTIVATION,
        "1",
        "host",
        before=("--endpoint", hub.url),
        home=home,
        wrap=NO_NET,
        env=cli_env(FRT_RETRY_ATTEMPTS="1"),
    )
    assert p.returncode == 3 and "unreachable" in one_line_error(p)


def test_ledger_is_wal_with_a_schema_version(hub, home):
    run_cli("--endpoint", hub.url, "scan", RELU, home=home)
    con = sqlite3.connect(home / "ledger.sqlite")
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert con.execute("SELECT max(version) FROM schema_migrations").fetchone()[0] >= 1


# -- one line, never a traceback: what a user's environment gets wrong ------------------------------


@pytest.mark.parametrize(
    "setup, args, env, code, needle",
    [
        ("file", ["report"], {}, 2, "is not usable: "),
        ("", ["--endpoint", "notaurl", "scan", ACTIVATION], {}, 2, "is not an upstream URL"),
        ("", ["--endpoint", "ftp://127.0.0.1/x", "scan", ACTIVATION], {}, 2, "is not an upstream URL"),
        ("", ["scan", ACTIVATION], {"FRT_RETRY_ATTEMPTS": "abc"}, 2, "FRT_RETRY_ATTEMPTS='abc' is not an integer"),
        (
            "",
            ["resolve", ACTIVATION, "--version", "1", "--target", "torch2.11-cu13-x86_64-linux"],
            {},
            2,
            "unknown backend 'cu13'",
        ),
        (
            "",
            ["resolve", ACTIVATION, "--version", "1", "--target", "torch2.11-cpu-sparc-linux"],
            {},
            2,
            "unknown cpu 'sparc'",
        ),
    ],
    ids=["home-is-a-file", "endpoint-not-a-url", "endpoint-ftp", "retry-attempts-abc", "target-cu13", "target-sparc"],
)
def test_a_bad_environment_is_one_line(home, tmp_path, setup, args, env, code, needle):
    t = time.monotonic()
    if setup == "file":  # FRT_MIRROR_HOME naming a file (--home is click's to check)
        home.parent.mkdir(parents=True, exist_ok=True)
        home.write_text("not a directory")
        exe = str(Path(sys.executable).with_name("frt-mirror"))
        p = subprocess.run([exe, *args], capture_output=True, text=True, env=cli_env(FRT_MIRROR_HOME=str(home)))
    else:
        # A process: huggingface_hub reads HF_ENDPOINT as it is imported (a dead one: nothing real is asked)
        p = run_cli_process(*args, home=home, env=cli_env(HF_ENDPOINT="http://127.0.0.1:9", **env))
    assert p.returncode == code, (p.stdout, p.stderr)
    assert needle in one_line_error(p)
    assert time.monotonic() - t < 20, "refused at once, not after retries"


def test_an_unwritable_bundle_target_is_one_line(hub, home, tmp_path):
    from tests.support.cli import X86, write_manifest

    m = write_manifest(tmp_path / "m.toml", {"kernels-test/relu": {"version": 1}}, [X86])
    assert run_cli("--endpoint", hub.url, "stage", str(m), home=home).returncode == 0
    p = run_cli("bundle", "/proc/frt-cannot-write-here.tar", home=home)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr, p.stderr


def test_exit_codes_are_in_the_help(home):
    p = run_cli("--help", home=home)
    assert "3 the upstream" in " ".join(p.stdout.split())


@pytest.mark.parametrize(
    "args",
    [["--help"], ["stage", "--help"], ["--version"], ["nosuch"], ["matrix", ACTIVATION], ["scan", "../../etc"]],
    ids=["help", "stage-help", "version", "unknown-command", "not-in-the-ledger", "bad-repo-id"],
)
def test_in_this_process_a_command_answers_as_the_console_script_does(home, args):
    """run_cli (this process) stands in for run_cli_process (the installed script) only while both give the
    same exit code, stdout and stderr: the help at a pipe's width, click's usage errors, FrtError's line."""
    inside = run_cli("--endpoint", "http://127.0.0.1:9", *args, home=home)
    outside = run_cli_process("--endpoint", "http://127.0.0.1:9", *args, home=home)
    assert (inside.returncode, inside.stdout, inside.stderr) == (outside.returncode, outside.stdout, outside.stderr)


# -- hostile numbers, URLs and ledgers: one line, never a traceback (issue 27, item 8) --------------

X86_T = "torch2.13-cpu-x86_64-linux"
HUGE = "9" * 20


@pytest.mark.parametrize(
    "args, env, needle",
    [
        (["resolve", ACTIVATION, "--version", HUGE, "--target", X86_T], {}, "not in the range 0<=x<=2147483647"),
        (["env", "--target", X86_T, "--version", f"{ACTIVATION}={HUGE}"], {}, "N up to 2147483647"),
        (["--endpoint", "http://[::1", "scan", ACTIVATION], {}, "--endpoint 'http://[::1' is not an upstream URL"),
        (["scan", ACTIVATION, "--endpoint", "http://h:99999"], {}, "is not an upstream URL"),
        (["report"], {"HF_ENDPOINT": "http://[::1"}, "HF_ENDPOINT 'http://[::1' is not an upstream URL"),
        (["report"], {"HF_ENDPOINT": "http://mirror:99999"}, "HF_ENDPOINT 'http://mirror:99999' is not an upstream"),
        (
            ["token", "add", "ci"],
            {"FRT_LEDGER_BUSY_TIMEOUT": "1e400"},
            "FRT_LEDGER_BUSY_TIMEOUT='1e400' is not a finite",
        ),
        (["token", "add", "ci"], {"FRT_LEDGER_BUSY_TIMEOUT": "nan"}, "is not a finite number"),
        (["token", "add", "ci"], {"FRT_LEDGER_BUSY_TIMEOUT": HUGE}, "out of range"),
        (["scan", ACTIVATION], {"FRT_RETRY_ATTEMPTS": HUGE}, "out of range"),
        (["report"], {"FRT_LEDGER_URL": "garbage"}, "FRT_LEDGER_URL 'garbage' is not a ledger URL"),
        (
            ["--ledger", "postgres-typo@db:5432/frt", "report"],
            {},
            "--ledger 'postgres-typo@db:5432/frt' is not a ledger",
        ),
        (["--ledger", "postgresql://u@db:notaport/frt", "report"], {}, "is not a URL"),
        (["--ledger", "postgresql://u@[::1/frt", "report"], {}, "is not a URL"),
        (["--ledger", "mysql://u@db/frt", "report"], {}, "keeps its ledger in SQLite"),
        (["serve", "--refs-ttl", "nan"], {}, "'nan' is not a number of seconds"),
        (["serve", "--header-timeout", "inf"], {}, "Invalid value for '--header-timeout'"),
        (
            ["bisect", RELU, "--good", "a", "--bad", "b", "--target", X86_T, "--timeout", "nan", "--", "true"],
            {},
            "'nan' is not a number of seconds",
        ),
    ],
    ids=[
        "resolve-version",
        "env-version",
        "endpoint-ipv6",
        "endpoint-port",
        "hf-endpoint-ipv6",
        "hf-endpoint-port",
        "busy-inf",
        "busy-nan",
        "busy-huge",
        "retry-huge",
        "ledger-url-garbage",
        "ledger-typo",
        "ledger-port",
        "ledger-ipv6",
        "ledger-mysql",
        "refs-ttl-nan",
        "header-timeout-inf",
        "bisect-timeout-nan",
    ],
)
def test_hostile_values_are_one_line_and_nothing_is_created(tmp_path, args, env, needle):
    """Before: OverflowError, ValueError and OperationalError tracebacks, and `garbage` /
    `postgres-typo@db:5432/frt` became SQLite files in the working directory."""
    exe = str(Path(sys.executable).with_name("frt-mirror"))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    base = cli_env(**{"HF_ENDPOINT": "http://127.0.0.1:9", **env})
    p = subprocess.run(
        [exe, "--home", str(tmp_path / "home"), *args], capture_output=True, text=True, env=base, cwd=cwd, timeout=60
    )
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert needle in one_line_error(p)
    assert not list(cwd.iterdir())  # no ledger file named after the bad URL


def test_a_manifest_version_past_2_31_is_one_line(home, tmp_path):
    from tests.support.cli import write_manifest

    m = write_manifest(tmp_path / "m.toml", {RELU: {"version": 99999999999999999999}}, [X86_T])
    p = run_cli("--endpoint", "http://127.0.0.1:9", "stage", str(m), home=home)
    assert p.returncode == 2 and "up to 2147483647" in one_line_error(p)  # before: OverflowError in the ledger


def _staged_home(hub, home, tmp_path) -> None:
    from tests.support.cli import write_manifest

    m = write_manifest(tmp_path / "m.toml", {RELU: {"version": 1}}, [X86_T])
    p = run_cli("--endpoint", hub.url, "stage", str(m), home=home)
    assert p.returncode == 0, p.stderr


def test_a_ledger_missing_a_table_is_one_line(hub, home, tmp_path):
    _staged_home(hub, home, tmp_path)
    with sqlite3.connect(home / "ledger.sqlite") as db:
        db.execute("DROP TABLE staged")
    for args in (["report"], ["verify"], ["env", "--target", X86_T]):
        p = run_cli(*args, home=home)
        assert p.returncode == 2, (args, p.stderr)  # before: OperationalError: no such table: staged
        assert "missing its table(s) staged" in one_line_error(p)


def test_an_empty_ledger_beside_a_full_store_is_refused_and_says_how_to_adopt(hub, home, tmp_path):
    """A store from before the ledger's records were kept beside the blobs (store/records/): nothing to
    rebuild from, so the line says how to adopt the blobs (test_ledger_rebuild: a store with records)."""
    _staged_home(hub, home, tmp_path)
    shutil.rmtree(home / "store" / "records")
    ledger = home / "ledger.sqlite"
    for extra in (home / "ledger.sqlite-wal", home / "ledger.sqlite-shm"):
        extra.unlink(missing_ok=True)
    ledger.write_bytes(b"")  # a failed copy, a truncation
    for args in (["verify"], ["report"], ["stage", str(tmp_path / "m.toml")]):
        p = run_cli(*args, home=home)
        assert p.returncode == 2, (args, p.stdout, p.stderr)  # before: verify said ok, on a new empty ledger
        line = one_line_error(p)
        assert "is empty (0 bytes) but the store" in line and "remove the empty file" in line, line
    assert ledger.stat().st_size == 0  # left as it was found
    ledger.unlink()  # what the line says to do: a new ledger over the blobs, which verify adopts
    p = run_cli("verify", "--json", home=home)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["adopted"] > 0
