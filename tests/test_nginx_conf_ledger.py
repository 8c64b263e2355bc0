"""`nginx-conf`'s replica commands carry the ledger it was told about (issue 26). Run as printed, on a
home whose ledger is on a real PostgreSQL, they serve what was staged there through nginx; without
that, a replica opened an empty SQLite ledger in the home and answered RepoNotFound to everything.
And a config for replicas on other hosts is refused when they would have no ledger to share."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.cli import X86, cli_env, run_cli, run_resolve, write_manifest
from tests.support.fakehub import FakeHub
from tests.support.kernel_fixtures import ORG, RELU, demo_repos
from tests.support.nginx import nginx
from tests.support.serve_helpers import Served, free_port, raw_http, raw_request

BIN = str(Path(sys.executable).parent)  # where `frt-mirror`, as the printed commands name it, is installed
REPLICA = re.compile(r"#   (frt-mirror .*)")


def env_without_ledger(**extra: str) -> dict[str, str]:
    """The CLI's environment with no FRT_LEDGER_URL: the ledger is only what a command line says."""
    env = {k: v for k, v in cli_env(**extra).items() if k != "FRT_LEDGER_URL"}
    env["PATH"] = f"{BIN}:{env.get('PATH', '/usr/bin:/bin')}"
    return env


def staged_on(url: str, home: Path, tmp: Path) -> dict:
    """RELU v1 staged into `home` with its ledger at `url`; one of its files, as resolve names it."""
    manifest = write_manifest(tmp / "m.toml", {RELU: {"version": 1}}, [X86], trust=[ORG])
    with FakeHub(demo_repos(), trusted_orgs=[ORG], page_size=5) as hub:
        p = run_cli("--ledger", url, "--endpoint", hub.url, "stage", str(manifest), home=home, env=env_without_ledger())
        assert p.returncode == 0, p.stderr
    p = run_resolve(
        RELU, "1", X86, "--offline", "--json", before=("--ledger", url), home=home, env=env_without_ledger()
    )
    assert p.returncode == 0, p.stderr
    assert not (home / "ledger.sqlite").exists()  # everything went to the server
    return max(json.loads(p.stdout)["files"], key=lambda f: f["size"])


def conf_for(home: Path, url: str, ports: list[int], listen: int, run: Path) -> str:
    args = ["--ledger", url, "nginx-conf", "--listen", f"127.0.0.1:{listen}", "--run-dir", str(run)]
    for p in ports:
        args += ["--upstream", f"127.0.0.1:{p}"]
    if os.geteuid() == 0:  # as tests/test_serve_nginx.py: root's nginx workers would be `nobody`
        args += ["--user", "root"]
    p = run_cli(*args, home=home, env=env_without_ledger())
    assert p.returncode == 0, p.stderr
    return p.stdout


@contextlib.contextmanager
def replicas_as_printed(conf: str, env: dict, logs: Path, timeout: float = 60):
    """Each replica command of the config's comments, run by a shell exactly as written there."""
    lines = [m[1] for ln in conf.splitlines() if (m := REPLICA.fullmatch(ln))]
    assert lines, conf
    logs.mkdir(parents=True, exist_ok=True)
    served = []
    try:
        for i, line in enumerate(lines):
            words = shlex.split(line)
            port = int(words[words.index("--port") + 1])
            with open(logs / f"out{i}", "wb") as out, open(logs / f"err{i}", "wb") as err:
                proc = subprocess.Popen(["sh", "-c", f"exec {line}"], stdout=out, stderr=err, env=env)
            served.append(Served(f"http://127.0.0.1:{port}", port, proc, logs / f"out{i}", logs / f"err{i}"))
        deadline = time.monotonic() + timeout
        for s in served:
            while True:
                if s.proc.poll() is not None:
                    raise AssertionError(f"replica exited {s.proc.returncode}: {s.stderr()[-2000:]}")
                with contextlib.suppress(OSError):
                    if raw_http(s.port, raw_request("GET", "/api/agent-harnesses"), timeout=2)[0]:
                        break
                assert time.monotonic() < deadline, "a replica did not answer in time"
                time.sleep(0.1)
        yield lines, served
    finally:
        for s in served:
            s.proc.terminate()
        for s in served:
            try:
                s.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                s.proc.kill()
                s.proc.wait()


def git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@pytest.mark.parametrize("password", [False, True], ids=["no-password", "password"])
def test_replicas_run_as_printed_serve_the_server_ledger_through_nginx(pg_url, tmp_path, password):
    """Stage on PostgreSQL, print the config with `--ledger URL`, start its two replicas by running the
    command lines in its comments, start nginx on it: a staged file comes through nginx (200, its
    bytes), and each replica answers it too. A URL with a password is not written into the file: the
    commands read it from FRT_LEDGER_URL, which the comment says to set."""
    url = pg_url.replace("postgres@", "postgres:s3cret-pw@") if password else pg_url  # trust auth: ignored
    home, run = tmp_path / "home", tmp_path / "nginx"
    f = staged_on(url, home, tmp_path)
    conf = conf_for(home, url, [free_port(), free_port()], free_port(), run)
    env = env_without_ledger()
    if password:
        assert "s3cret-pw" not in conf
        assert "postgresql+psycopg://postgres:***@127.0.0.1" in conf and "set FRT_LEDGER_URL" in conf, conf
        env["FRT_LEDGER_URL"] = url
    path = f"/kernels/{RELU}/resolve/v1/{f['path']}"
    with replicas_as_printed(conf, env, tmp_path / "replicas") as (lines, replicas):
        assert len(lines) == 2
        with nginx(conf, run, replicas) as front:
            for _ in range(4):  # round robin: both replicas answer some of them
                status, headers, body = raw_http(front.port, raw_request("GET", path))
                assert status == 200, (status, headers, body[:300])
                assert len(body) == f["size"] and git_oid(body) == f["git_oid"]
        for r in replicas:
            status, headers, _ = raw_http(r.port, raw_request("HEAD", path))
            assert status == 200 and headers["x-repo-commit"], (status, headers, r.stderr()[-2000:])
            assert "nothing is staged" not in r.stderr()
    for line in lines:
        assert (f"--ledger {pg_url}" if not password else '--ledger "${FRT_LEDGER_URL:?}"') in line, line


def test_replicas_elsewhere_without_a_server_ledger_are_refused_in_one_line(tmp_path, pg_url):
    """Several replicas on other hosts (addresses that are not this host's) and no ledger on a server:
    each would open the home's SQLite file over the shared filesystem, where SQLite's locking does not
    hold. Refused, one line, exit 2; an explicit `--ledger sqlite:///…` changes nothing there. One
    replica elsewhere, replicas on this host, or a server ledger: printed."""
    home = tmp_path / "home"
    (home / "store" / "sha256").mkdir(parents=True)
    elsewhere = ["--upstream", "192.0.2.11:8471", "--upstream", "192.0.2.12:8471"]  # TEST-NET-1: never ours
    for ledger in ([], ["--ledger", f"sqlite:///{home}/ledger.sqlite"]):
        p = run_cli(*ledger, "nginx-conf", *elsewhere, home=home, env=env_without_ledger())
        assert (p.returncode, p.stdout) == (2, ""), p.stdout
        assert p.stderr.splitlines() == [
            "frt-mirror: --upstream 192.0.2.11:8471, 192.0.2.12:8471: replicas on other hosts than this one "
            "cannot share a SQLite ledger (the home's file over a shared filesystem): give the ledger on a "
            "database server, --ledger postgresql://USER@HOST:PORT/DB or FRT_LEDGER_URL, or run every "
            "replica on this host"
        ], p.stderr
    ok = [
        (["--upstream", "192.0.2.11:8471"], ""),
        (["--upstream", "127.0.0.1:8471", "--upstream", "[::1]:8472", "--upstream", "localhost:8473"], ""),
        (["--upstream", "127.0.0.1:8471", "--upstream", "127.0.0.1:8472"], f"sqlite:///{home}/ledger.sqlite"),
        (elsewhere, pg_url),
    ]
    for upstreams, ledger in ok:
        p = run_cli(
            *(["--ledger", ledger] if ledger else []), "nginx-conf", *upstreams, home=home, env=env_without_ledger()
        )
        assert p.returncode == 0, (upstreams, p.stderr)
        lines = [m[1] for ln in p.stdout.splitlines() if (m := REPLICA.fullmatch(ln))]
        assert len(lines) == len(upstreams) // 2
        said = f" --ledger {ledger} serve " if ledger else f"--home {home} serve "
        assert all(said in ln for ln in lines), (said, lines)
    # The ledger nginx-conf was told about through the environment is printed as well.
    p = run_cli("nginx-conf", *elsewhere, home=home, env={**env_without_ledger(), "FRT_LEDGER_URL": pg_url})
    assert p.returncode == 0, p.stderr
    assert f"#   frt-mirror --home {home} --ledger {pg_url} serve --host 192.0.2.11" in p.stdout
