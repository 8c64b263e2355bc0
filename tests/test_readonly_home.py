"""A home on a read-only mount, as a cluster often has it: everything that only reads works there.

The home is staged writable, then every command runs against a read-only bind mount of it inside a
private mount namespace (`unshare -m`). CI runs as root, which permission bits do not stop, so only a
read-only mount proves that nothing writes: SQLite's -wal/-shm files, a migration, an adopted blob.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from frt.resolver.ledger.schema import SCHEMA_VERSION
from tests.support.cli import X86, cli_env, one_line, run_cli, stage_json, write_manifest
from tests.support.fakehub import FakeHub
from tests.support.kernel_fixtures import ACTIVATION, ORG, RELU, X86_CPU, demo_repos
from tests.support.offline import read_only
from tests.support.serve_helpers import free_port

EXE = str(Path(sys.executable).with_name("frt-mirror"))


@pytest.fixture(scope="module")
def staged(tmp_path_factory) -> SimpleNamespace:
    """A home staged once, writable (activation v2 and relu v1 for this machine), and a mount point."""
    root = tmp_path_factory.mktemp("rohome")
    home, ro = root / "home", root / "ro"
    ro.mkdir()
    m = write_manifest(root / "frt-manifest.toml", {ACTIVATION: {"version": 2}, RELU: {"version": 1}}, [X86])
    with FakeHub(demo_repos(), trusted_orgs=[ORG], page_size=5) as hub:
        p, _ = stage_json(home, m, hub)
    assert p.returncode == 0, p.stderr
    assert sorted(x.name for x in home.glob("ledger.sqlite*")) == ["ledger.sqlite"]  # closed cleanly
    return SimpleNamespace(root=root, home=home, ro=ro, manifest=m)


def ro_cli(staged, *args: str, src: Path | None = None) -> subprocess.CompletedProcess:
    """`frt-mirror --home RO ARGS` on the read-only mount of the staged home (or of `src`)."""
    argv = [EXE, "--home", str(staged.ro), *args]
    return read_only(src or staged.home, staged.ro, "exec " + shlex.join(argv))


def test_the_mount_is_really_read_only(staged):
    p = read_only(staged.home, staged.ro, f"touch {staged.ro}/x")
    assert p.returncode != 0 and "Read-only file system" in p.stderr


def test_reading_commands_work_on_a_read_only_home(staged, tmp_path):
    p = ro_cli(staged, "env", "--target", X86, "--format", "json")
    assert p.returncode == 0, p.stderr
    assert f"{ACTIVATION}={staged.ro}/views/local/" in json.loads(p.stdout)["env"]["LOCAL_KERNELS"]
    p = ro_cli(staged, "resolve", ACTIVATION, "--version", "2", "--target", X86, "--offline", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["variant"] == X86_CPU
    p = ro_cli(staged, "resolve", ACTIVATION, "--version", "9", "--target", X86, "--offline")
    # A refusal on a read-only home is not recorded (that is a write), but still said.
    assert p.returncode == 1 and "refused" in p.stderr and "Traceback" not in p.stderr
    p = ro_cli(staged, "matrix", ACTIVATION)
    assert p.returncode == 0 and X86_CPU in p.stdout, p.stderr
    p = ro_cli(staged, "report", "--json")
    assert p.returncode == 0 and isinstance(json.loads(p.stdout), list), p.stderr
    p = ro_cli(staged, "token", "list")
    assert p.returncode == 0 and "no tokens" in p.stdout, p.stderr
    # export-cache and bundle write only where they are told, outside the mount.
    p = ro_cli(staged, "export-cache", str(tmp_path / "cache"), "--target", X86, "--json")
    assert p.returncode == 0, p.stderr
    assert {(r["repo"], r["ref"]) for r in json.loads(p.stdout)["refs"]} == {(ACTIVATION, "v2"), (RELU, "v1")}
    p = ro_cli(staged, "bundle", str(tmp_path / "out.tar"), "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["blobs"] > 0, p.stderr


def test_verify_reports_on_a_read_only_home_and_adopts_nothing(staged):
    data = b"an unrecorded but intact blob\n"
    sha = hashlib.sha256(data).hexdigest()
    stray = staged.home / "store" / "sha256" / sha[:2] / sha
    stray.parent.mkdir(exist_ok=True)
    stray.write_bytes(data)
    try:
        p = ro_cli(staged, "verify", "--json")
        assert p.returncode == 0, p.stderr
        doc = json.loads(p.stdout)
        assert doc["ok"] and doc["readonly"] and doc["adopted"] == 0 and doc["unadopted"] == 1
        p = ro_cli(staged, "verify")
        assert p.returncode == 0, p.stderr
        assert "read-only" in p.stdout and "1 verified blob(s) the ledger does not record" in p.stdout
    finally:
        stray.unlink()


def test_kernels_load_from_the_read_only_views(staged):
    code = f"import kernels; k = kernels.get_kernel({ACTIVATION!r}, version=2); print(k.VARIANT, k.add(2, 3))"
    env = {k: v for k, v in cli_env().items() if not k.startswith("LOCAL_KERNELS")}
    env.update(HF_HUB_OFFLINE="1")
    script = (
        f'eval "$({shlex.join([EXE, "--home", str(staged.ro), "env", "--target", X86])})" && '
        f"exec {shlex.quote(sys.executable)} -c {shlex.quote(code)}"
    )
    p = read_only(staged.home, staged.ro, script, env=env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == [X86_CPU, "5"]


def serve_read_only(staged, err: Path) -> tuple[subprocess.Popen, str]:
    """`serve` on the read-only mount of the staged home (its stderr to `err`): the process and its URL."""
    port = free_port()
    with open(err, "wb") as e:
        proc = read_only(
            staged.home,
            staged.ro,
            "exec " + shlex.join([EXE, "--home", str(staged.ro), "serve", "--port", str(port)]),
            net=True,
            popen=True,
            stdout=subprocess.DEVNULL,
            stderr=e,
        )
    return proc, f"http://127.0.0.1:{port}"


def test_serve_on_a_read_only_home(staged, tmp_path):
    err = tmp_path / "serve.err"
    proc, url = serve_read_only(staged, err)
    try:
        info = _get_json(f"{url}/api/kernels/{ACTIVATION}/revision/v2", proc, err)
        path = next(s["rfilename"] for s in info["siblings"] if s["rfilename"].endswith("__init__.py"))
        with urllib.request.urlopen(f"{url}/kernels/{ACTIVATION}/resolve/v2/{path}", timeout=10) as r:
            body = r.read()
        view = staged.home / "views" / "local" / ACTIVATION.replace("/", "--") / info["sha"]
        assert body == (view / path).read_bytes()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert "Traceback" not in err.read_text()


def _get_json(url: str, proc: subprocess.Popen, err: Path, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, err.read_text()
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return json.loads(r.read())
        except OSError:
            assert time.monotonic() < deadline, err.read_text()
            time.sleep(0.2)


def test_seats_open_the_ledger_read_only(staged):
    """What an engine worker does with a read-only home: attach opens the ledger, the kernel source
    loads a staged kernel, and an unstaged one is a refusal (whose record would be a write)."""
    code = textwrap.dedent(f"""
        import torch
        from pathlib import Path
        from frt.manifests import KernelRef, SeatCatalog
        from frt.seats import attach
        from frt.seats.errors import SiteRefused
        from frt.seats.source import KernelSource, open_ledger

        home = Path({str(staged.ro)!r})
        print(attach(torch.nn.Sequential(torch.nn.Linear(4, 4)).eval(), SeatCatalog(()), home=home).line())
        led = open_ledger(home)
        source = KernelSource(home, led, {{}})
        k = source.get(KernelRef({ACTIVATION!r}, version=2, function="add"))
        print(led.readonly, k.resolution.variant, k.module.add(2, 3))
        try:
            source.get(KernelRef({ACTIVATION!r}, version=9, function="add"))
        except SiteRefused as e:
            print("refused", "not staged" in str(e))
    """)
    env = {k: v for k, v in cli_env().items() if not k.startswith("LOCAL_KERNELS")}
    script = f"exec {shlex.quote(sys.executable)} -c {shlex.quote(code)}"
    p = read_only(staged.home, staged.ro, script, env=env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[1:] == [f"True {X86_CPU} 5", "refused True"]


def test_writing_commands_on_a_read_only_home_are_one_line(staged, tmp_path):
    p = ro_cli(staged, "--endpoint", "http://127.0.0.1:9", "stage", str(staged.manifest))
    assert p.returncode == 2 and "read-only" in one_line(p)
    p = ro_cli(staged, "token", "add", "ci")
    assert p.returncode == 2 and "read-only" in one_line(p)
    p = ro_cli(staged, "resolve", ACTIVATION, "--version", "2", "--target", X86, "--endpoint", "http://127.0.0.1:9")
    assert p.returncode == 2 and "--offline" in one_line(p)
    tar = tmp_path / "b.tar"
    assert run_cli("bundle", str(tar), home=staged.home).returncode == 0
    p = ro_cli(staged, "import", str(tar))
    assert p.returncode == 2 and "read-only" in one_line(p)


def _copy_ledger(staged, tmp_path: Path, edit: str) -> Path:
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(staged.home / "ledger.sqlite", other / "ledger.sqlite")
    with sqlite3.connect(other / "ledger.sqlite") as db:
        db.executescript(edit)
    db.close()
    return other


# env on a job start reads the ledger with sqlite3 alone (store/staged.py): it must say what report says.
READERS = [["report"], ["env", "--target", X86]]


@pytest.mark.parametrize("reader", READERS, ids=lambda r: r[0])
def test_a_newer_schema_on_a_read_only_mount_is_one_line(staged, tmp_path, reader):
    other = _copy_ledger(
        staged,
        tmp_path,
        "INSERT INTO schema_migrations (version, applied_at) "
        "SELECT max(version) + 1, '2030-01-01' FROM schema_migrations;",
    )
    p = ro_cli(staged, *reader, src=other)
    assert p.returncode == 2 and "newer than this frt-mirror understands" in one_line(p)


@pytest.mark.parametrize("reader", READERS, ids=lambda r: r[0])
def test_an_older_schema_on_a_read_only_mount_is_one_line(staged, tmp_path, reader):
    other = _copy_ledger(staged, tmp_path, "UPDATE schema_migrations SET version = version - 1;")
    p = ro_cli(staged, *reader, src=other)
    line = one_line(p)
    assert p.returncode == 2 and f"schema v{SCHEMA_VERSION - 1} needs migrating" in line
    assert "open it once read-write" in line


def test_a_write_ahead_log_left_on_a_read_only_mount(staged, tmp_path):
    """A writer that died (or runs on another host) leaves -wal and -shm: read through them. A -wal
    whose -shm is gone cannot be read on a read-only mount: one line saying what to do."""
    other = _copy_ledger(staged, tmp_path, "")
    crash = textwrap.dedent(f"""
        import os, sqlite3
        db = sqlite3.connect({str(other / "ledger.sqlite")!r})
        db.execute("PRAGMA wal_autocheckpoint = 0")
        db.execute("INSERT INTO tokens (name, sha256, created_at) "
                   "VALUES ('late', '{"0" * 64}', '2026-01-01')")
        db.execute("INSERT INTO staged (repo_id, requested, version, target, commit_sha, variant, staged_at) "
                   "VALUES ('late/kernel', 'v1', 1, '{X86}', '{"1" * 40}', 'v', '2026-01-01')")
        db.commit()
        os._exit(0)  # no close: the row stays in the -wal
    """)
    subprocess.run([sys.executable, "-c", crash], check=True)
    assert (other / "ledger.sqlite-wal").stat().st_size > 0 and (other / "ledger.sqlite-shm").exists()
    p = ro_cli(staged, "token", "list", "--json", src=other)
    assert p.returncode == 0, p.stderr
    assert [t["name"] for t in json.loads(p.stdout)] == ["late"]
    p = ro_cli(staged, "env", "--target", X86, "--format", "json", src=other)  # env's quick read, through the -shm
    assert "late/kernel" in [k["repo"] for k in json.loads(p.stdout)["kernels"]], p.stderr
    os.unlink(other / "ledger.sqlite-shm")
    for reader in (["token", "list"], ["env", "--target", X86]):
        p = ro_cli(staged, *reader, src=other)
        assert p.returncode == 2 and "write-ahead log" in one_line(p), reader


KERNELS_AGENT = "kernels/0.17.2; python/3.11; backend/cpu; platform/x86_64-linux; file_type/kernel; torch/2.13.0"


def test_serve_counts_demand_on_a_read_only_home_without_failing_a_request(staged, tmp_path):
    """The demand counts cannot be written to a read-only ledger: under load from kernels clients (8
    threads, listings and file GETs) no request fails and no byte is wrong; serve says once that its
    counts wait in memory, and nothing on the mount changes."""
    from concurrent.futures import ThreadPoolExecutor

    before = {p.name: p.stat().st_mtime_ns for p in staged.home.glob("ledger.sqlite*")}
    err = tmp_path / "serve.err"
    proc, url = serve_read_only(staged, err)
    try:
        info = _get_json(f"{url}/api/kernels/{ACTIVATION}/revision/v2", proc, err)
        path = next(s["rfilename"] for s in info["siblings"] if s["rfilename"].endswith("__init__.py"))
        view = staged.home / "views" / "local" / ACTIVATION.replace("/", "--") / info["sha"]
        want = (view / path).read_bytes()

        def ask(i: int) -> bool:
            where = f"/api/kernels/{ACTIVATION}/tree/v2/build" if i % 2 else f"/kernels/{ACTIVATION}/resolve/v2/{path}"
            req = urllib.request.Request(url + where, headers={"User-Agent": KERNELS_AGENT})
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    body = r.read()
            except OSError:
                return False
            return i % 2 == 1 and X86_CPU in body.decode() or body == want

        deadline = time.monotonic() + 5  # past two of the recorder's write attempts (every 2 s)
        results: list[bool] = []
        with ThreadPoolExecutor(8) as pool:
            while time.monotonic() < deadline:
                results += pool.map(ask, range(200))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    text = err.read_text()
    assert results and all(results), f"{results.count(False)} of {len(results)} requests failed"
    assert "Traceback" not in text
    assert text.count("demand: counts not written to the ledger yet (kept in memory)") == 1, text[-3000:]
    assert {p.name: p.stat().st_mtime_ns for p in staged.home.glob("ledger.sqlite*")} == before
