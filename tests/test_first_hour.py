"""A newcomer's first hour (issue "A newcomer's first hour"): the traps a careful user fell into, each
tried as they tried it, with the installed CLI."""

from __future__ import annotations

import subprocess

import pytest

from tests.support.cli import EXE, X86, cli_env, one_line, run_cli
from tests.support.fakehub import FakeHub
from tests.support.kernel_fixtures import ACTIVATION, ORG, demo_repos
from tests.support.serve_helpers import free_port

# Every command that only reads a home, with what else it needs to run.
READERS = {
    "verify": ["verify"],
    "report": ["report"],
    "report --demand": ["report", "--demand"],
    "matrix": ["matrix", ACTIVATION],
    "env": ["env", "--target", X86],
    "export-cache": ["export-cache", "{tmp}/hf-cache", "--target", X86],
    "serve": ["serve", "--port", "{port}"],
    "bundle": ["bundle", "{tmp}/kernels.tar"],
    "gc": ["gc"],
    "unstage": ["unstage", ACTIVATION],
    "bisect --offline": [
        "bisect",
        ACTIVATION,
        "--good",
        "v1",
        "--bad",
        "v2",
        "--target",
        X86,
        "--offline",
        "--",
        "true",
    ],
    "resolve --offline": ["resolve", ACTIVATION, "--version", "1", "--target", X86, "--offline"],
    "demand manifest": ["demand", "manifest"],
    "token list": ["token", "list"],
}


def _argv(name: str, tmp_path) -> list[str]:
    return [a.format(tmp=tmp_path, port=free_port()) for a in READERS[name]]


@pytest.mark.parametrize("name", sorted(READERS))
def test_a_command_that_reads_a_home_refuses_one_that_is_not_there_and_creates_nothing(name, tmp_path):
    """Before: `verify` on a mistyped --home created it and said `0 blobs (0 B) re-hashed … ok`, exit 0."""
    nope = tmp_path / "nope"
    p = run_cli(*_argv(name, tmp_path), home=nope)
    assert p.returncode == 2, (name, p.returncode, p.stdout, p.stderr)
    line = one_line(p)
    assert f"no frt-mirror home at {nope}" in line and "stage or import creates a home" in line, line
    assert not nope.exists() and sorted(x.name for x in tmp_path.iterdir()) == [], "nothing is created"
    assert p.stdout == ""

    nope.mkdir()  # a folder, but no ledger in it: the same refusal, and still nothing written
    p = run_cli(*_argv(name, tmp_path), home=nope)
    assert p.returncode == 2 and "has no ledger (ledger.sqlite)" in one_line(p), (name, p.stderr)
    assert list(nope.iterdir()) == []


@pytest.mark.parametrize("name", ["verify", "report", "env"])
def test_with_no_home_set_a_reading_command_does_not_create_the_default_one(name, tmp_path):
    """No --home, no FRT_MIRROR_HOME: the default (XDG_DATA_HOME/frt-mirror) is named, and not created."""
    env = cli_env(XDG_DATA_HOME=str(tmp_path / "xdg"))
    p = subprocess.run([EXE, *_argv(name, tmp_path)], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 2, p.stderr
    assert f"no frt-mirror home at {tmp_path / 'xdg' / 'frt-mirror'}" in one_line(p)
    assert not (tmp_path / "xdg").exists()


def test_commands_that_write_a_home_still_create_it(tmp_path):
    with FakeHub(demo_repos(), trusted_orgs=[ORG]) as hub:
        for name, argv in {
            "scan": ["--endpoint", hub.url, "scan", ACTIVATION],
            "resolve": ["--endpoint", hub.url, "resolve", ACTIVATION, "--version", "1", "--target", X86],
            "token add": ["token", "add", "ci"],
        }.items():
            home = tmp_path / name.replace(" ", "-")
            p = run_cli(*argv, home=home)
            assert p.returncode == 0, (name, p.stderr)
            assert (home / "ledger.sqlite").is_file(), name
            assert run_cli("report", home=home).returncode == 0, name  # and it reads as a home after


def test_matrix_of_a_typo_suggests_the_scanned_name_not_a_scan_of_the_typo(tmp_path):
    """Before: `matrix kernels-test/activaton` said to run `frt-mirror scan kernels-test/activaton`."""
    home, typo = tmp_path / "home", ACTIVATION.replace("activation", "activaton")
    with FakeHub(demo_repos(), trusted_orgs=[ORG]) as hub:
        assert run_cli("--endpoint", hub.url, "scan", ACTIVATION, home=home).returncode == 0
    p = run_cli("matrix", typo, home=home)
    assert p.returncode == 2
    assert one_line(p).endswith(f"{typo} is not in the ledger: did you mean {ACTIVATION}?"), p.stderr
    p = run_cli("matrix", "acme/other", home=home)
    assert p.returncode == 2 and "run 'frt-mirror scan acme/other' first, if that is its name" in one_line(p)


TYPO = ACTIVATION.replace("activation", "activaton")
BAD_TARGET = "torch9.9-bogus"


@pytest.fixture(scope="module")
def scanned(tmp_path_factory):
    """A home where ACTIVATION is staged (so scanned), and the upstream that has it."""
    tmp = tmp_path_factory.mktemp("scanned")
    home = tmp / "home"
    (tmp / "ok.toml").write_text(f'[kernels]\n"{ACTIVATION}" = {{ version = 1 }}\n')
    (tmp / "typo.toml").write_text(f'[kernels]\n"{TYPO}" = {{ version = 1 }}\n')
    (tmp / "bad.toml").write_text("[kernels\n")
    with FakeHub(demo_repos(), trusted_orgs=[ORG]) as hub:
        assert run_cli("--endpoint", hub.url, "stage", str(tmp / "ok.toml"), "--target", X86, home=home).returncode == 0
        yield home, hub, tmp


MISTAKES = {
    # a repository that is not there (a typo of one that is): every command that takes a repo
    "scan typo": ["scan", TYPO],
    "resolve typo": ["resolve", TYPO, "--version", "1", "--target", X86],
    "resolve --offline typo": ["resolve", TYPO, "--version", "1", "--target", X86, "--offline"],
    "stage typo": ["stage", "{tmp}/typo.toml", "--target", X86],
    "pin typo": ["pin", TYPO, "v1", "--target", X86],
    "bisect typo": ["bisect", TYPO, "--good", "v1", "--bad", "v2", "--target", X86, "--offline", "--", "ls"],
    "matrix typo": ["matrix", TYPO],
    "unstage typo": ["unstage", TYPO],
    "env --version typo": ["env", "--target", X86, "--version", f"{TYPO}=1"],
    # an unknown target: every command that takes one
    "resolve target": ["resolve", ACTIVATION, "--version", "1", "--target", BAD_TARGET],
    "stage target": ["stage", "{tmp}/ok.toml", "--target", BAD_TARGET],
    "env target": ["env", "--target", BAD_TARGET],
    "export-cache target": ["export-cache", "{tmp}/cache", "--target", BAD_TARGET],
    "matrix target": ["matrix", ACTIVATION, "--target", BAD_TARGET],
    "pin target": ["pin", ACTIVATION, "v1", "--target", BAD_TARGET],
    "bisect target": ["bisect", ACTIVATION, "--good", "v1", "--bad", "v2", "--target", BAD_TARGET, "--", "ls"],
    "bundle target": ["bundle", "{tmp}/b.tar", "--target", BAD_TARGET],
    "unstage target": ["unstage", ACTIVATION, "--target", BAD_TARGET],
    # a malformed manifest
    "stage manifest": ["stage", "{tmp}/bad.toml"],
}


@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_one_mistake_is_one_exit_code_from_every_command(name, scanned):
    """Before: the same "repository not found" exited 2 from scan, 1 from stage, resolve and pin; and
    matrix advised scanning the typo. Bad input is 2 from every command (docs/targets.md's table), in one
    line, and a typo of a known repo is named as what was meant."""
    home, hub, tmp = scanned
    p = run_cli("--endpoint", hub.url, *(a.format(tmp=tmp) for a in MISTAKES[name]), home=home)
    assert p.returncode == 2, (name, p.returncode, p.stderr)
    line = [ln for ln in p.stderr.splitlines() if ln.startswith("frt-mirror: ")][-1]
    if name.endswith("typo"):
        assert line.endswith(f"did you mean {ACTIVATION}?"), line
        assert f"scan {TYPO}" not in line
    elif name.endswith("target"):
        assert f"unknown target '{BAD_TARGET}'" in line, line
    else:
        assert "bad.toml:1: syntax" in line, line


def test_bundle_and_matrix_html_do_not_replace_a_file_unless_forced(scanned, tmp_path):
    """Before: `bundle kernels.tar` silently replaced a kernels.tar that a later incremental bundle named
    as its --since base, and that chain could no longer be imported."""
    import hashlib

    home, hub, _ = scanned
    base, later = tmp_path / "kernels.tar", tmp_path / "later.tar"
    assert run_cli("bundle", str(base), "-q", home=home).returncode == 0
    assert run_cli("bundle", str(later), "--since", str(base), "-q", home=home).returncode == 0
    before = hashlib.sha256(base.read_bytes()).hexdigest()
    p = run_cli("bundle", str(base), "-q", home=home)
    assert p.returncode == 2, p.stderr
    assert one_line(p).endswith(
        f"{base} exists: bundle does not replace it (it may be a later bundle's --since base); --force does"
    )
    assert hashlib.sha256(base.read_bytes()).hexdigest() == before
    assert not [x.name for x in tmp_path.iterdir() if x.name.startswith(".")], "no temp file left"
    cluster = tmp_path / "cluster"
    for tar in (base, later):  # the chain still imports
        assert run_cli("import", str(tar), home=cluster).returncode == 0
    assert run_cli("bundle", str(base), "-q", "--force", home=home).returncode == 0

    page = tmp_path / "m.html"
    page.write_text("the operator's own notes")
    p = run_cli("matrix", ACTIVATION, "--html", str(page), home=home)
    assert p.returncode == 2 and one_line(p).endswith("m.html exists: matrix --html does not replace it; --force does")
    assert page.read_text() == "the operator's own notes"
    assert run_cli("matrix", ACTIVATION, "--html", str(page), "--force", home=home).returncode == 0
    assert "<html" in page.read_text()


def test_a_repo_asked_for_under_the_wrong_type_is_the_hubs_answer_and_says_where_it_is(scanned):
    """Before: HEAD /kernels-test/activation/resolve/… (a kernel asked for as a model, without the
    /kernels/ prefix) said only `… is not staged on this mirror`, though it is, as a kernel."""
    from tests.support.serve_helpers import raw_http, raw_request, serving

    home, _, _ = scanned
    with serving(home) as m:
        for method in ("HEAD", "GET"):
            status, headers, _ = raw_http(m.port, raw_request(method, f"/{ACTIVATION}/resolve/v1/metadata.json"))
            assert (status, headers.get("x-error-code")) == (404, "RepoNotFound"), (method, status, headers)
            assert headers["x-error-message"].endswith(
                f"{ACTIVATION} is not staged on this mirror as a model; it is staged as a kernel (kernels/{ACTIVATION})"
            ), headers
        status, headers, _ = raw_http(m.port, raw_request("HEAD", "/acme/none/resolve/main/x.json"))
        assert headers["x-error-message"].endswith("acme/none is not staged on this mirror"), headers


def test_make_try_keeps_the_demo_upstream_up_for_the_readme_and_ctrl_c_stops_it(tmp_path):
    """Before: after `make demo` the demo upstream was gone and the example manifest named
    kernels-community/*, so the quickstart could not be followed past `make demo` on a box with no Hub."""
    import signal
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    assert "make try" in readme and ".venv/bin" in readme, "the README says what make try is and where frt-mirror is"
    proc = subprocess.Popen(  # as make runs it, but in a folder of its own (it writes its manifest there)
        [sys.executable, "-m", "tests.demo", "try"],
        cwd=tmp_path,
        env={**cli_env(), "PYTHONPATH": str(root)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        first = proc.stdout.readline()
        url = first.split()[2]
        assert first.startswith("demo upstream: http://127.0.0.1:"), first
        manifest = Path(proc.stdout.readline().split(": ", 1)[1].strip())
        assert manifest == tmp_path / "demo-manifest.toml"
        home = tmp_path / "home"
        p = run_cli("--endpoint", url, "stage", str(manifest), home=home)
        assert p.returncode == 0, p.stderr
        assert run_cli("verify", home=home).returncode == 0
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0 and time.monotonic() - t0 < 5
        assert proc.stdout.read().rstrip().endswith("demo upstream stopped")
    finally:
        proc.kill()


def test_a_refusal_for_several_targets_is_one_line_and_matrix_says_what_its_marks_mean(scanned):
    """Before: a refusal that held for three targets was printed three times; matrix never said what
    `.` and `-` mean."""
    home, hub, tmp = scanned
    targets = [X86, "torch2.11-cu130-x86_64-linux", "torch2.11-cu130-aarch64-linux"]
    m = tmp / "three.toml"
    m.write_text(
        "".join(f'[[targets]]\ntarget = "{t}"\n' for t in targets) + f'[kernels]\n"{TYPO}" = {{ version = 1 }}\n'
    )
    p = run_cli("--endpoint", hub.url, "stage", str(m), home=home)
    assert p.returncode == 2
    said = [ln for ln in p.stderr.splitlines() if TYPO in ln]
    assert len(said) == 1 and said[0].endswith(f"(for 3 targets: {', '.join(sorted(targets))})"), p.stderr
    assert TYPO in p.stdout  # the result (the rows) on stdout, the diagnostics on stderr

    p = run_cli("matrix", ACTIVATION, home=home)
    assert p.returncode == 0
    assert ". = not built" in p.stdout and "- = not served" in p.stdout, p.stdout


@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_on_sigterm_says_it_stopped_and_exits_within_a_second(scanned, workers):
    """Before: about 2 s to exit, and nothing said (one process: killed by the re-raised signal, -15)."""
    import signal
    import time

    from tests.support.serve_helpers import raw_http, raw_request, serving

    home, _, _ = scanned
    with serving(home, "--workers", workers) as m:
        assert raw_http(m.port, raw_request("GET", f"/api/kernels/{ACTIVATION}/refs"))[0] == 200
        t0 = time.monotonic()
        m.proc.send_signal(signal.SIGTERM)
        assert m.proc.wait(timeout=10) == 0
        took = time.monotonic() - t0
        last = m.stderr().splitlines()[-1]
    assert took < 1.0, took
    assert last.startswith("frt-mirror: serve stopped on SIGTERM: ") and "in flight" in last, last
