"""A replica (re)started while the ledger is down serves: from the catalog snapshot it or a sibling wrote
beside the home (mirror/serve/snapshot.py), checked against the store, said in one line; and it catches up
when the ledger answers again.

On the session's real PostgreSQL, stopped and started here: the snapshot equals the catalog loaded from the
ledger; a serve started with PostgreSQL stopped becomes ready from it (its --ready-file written), answers,
and refuses in one line, exit 3, where the snapshot is missing, of another format, or does not match the
store. Then the issue's test: two replicas behind nginx, 64 clients, PostgreSQL stopped, one replica
SIGKILLed and started again: 0 failed, 0 wrong bytes; PostgreSQL back, a change staged is served by the
restarted replica within seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.cli import X86, cli_env, run_cli, run_cli_process, write_manifest
from tests.support.fakehub import FakeHub
from tests.support.kernel_fixtures import ACTIVATION, LAYERNORM, ORG, RELU, demo_repos
from tests.support.load import File, hub_files, load
from tests.support.nginx import PREFIX, nginx, nginx_conf
from tests.support.serve_helpers import free_port, raw_http, raw_request, replica_env

EXE = str(Path(sys.executable).with_name("frt-mirror"))


@dataclass
class Site:
    home: Path
    url: str  # the ledger's
    hub: FakeHub
    token: str
    files: list[File]
    tmp: Path

    def env(self) -> dict[str, str]:
        return cli_env(FRT_LEDGER_URL=self.url)

    def stage(self, kernels: dict) -> list[dict]:
        m = write_manifest(self.tmp / f"m{len(list(self.tmp.glob('m*.toml')))}.toml", kernels, [X86], trust=[ORG])
        p = run_cli("--endpoint", self.hub.url, "stage", str(m), "--json", home=self.home, env=self.env())
        assert p.returncode == 0, p.stderr + p.stdout[-2000:]
        return json.loads(p.stdout)["rows"]


@pytest.fixture(scope="module")
def site(pg_server, tmp_path_factory):
    """activation and layernorm staged on a database of the session's PostgreSQL, with a bearer token."""
    tmp = tmp_path_factory.mktemp("snapshot")
    pg_server.start()
    url = pg_server.new_database()
    with FakeHub(demo_repos(), trusted_orgs=[ORG], page_size=5) as hub:
        s = Site(tmp / "home", url, hub, "", [], tmp)
        rows = s.stage({ACTIVATION: {"version": 1}, LAYERNORM: {"version": 1}})
        p = run_cli("token", "add", "fleet", home=s.home, env=s.env())
        assert p.returncode == 0, p.stderr
        s.token, s.files = p.stdout.strip(), hub_files(hub, rows)
        yield s
    pg_server.start()


@contextlib.contextmanager
def ledger_stopped(pg_server):
    pg_server.stop()
    try:
        yield
    finally:
        pg_server.start()


class Replica:
    """`serve --ready-file` as a supervisor runs it, on a port of the caller's (to be started again on it)."""

    def __init__(self, site: Site, port: int, where: Path, *args: str):
        self.site, self.port, self.where, self.args = site, port, where, args
        self.ready, self.err = where / "ready", where / "stderr"
        self.proc: subprocess.Popen | None = None
        where.mkdir(parents=True, exist_ok=True)

    def start(self) -> Replica:
        with open(self.err, "ab") as err:
            self.proc = subprocess.Popen(
                [EXE, "--home", str(self.site.home), "serve", "--port", str(self.port), "--ready-file", str(self.ready)]
                + list(self.args),
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=replica_env(FRT_LEDGER_URL=self.site.url),
            )
        return self

    def wait_ready(self, timeout: float = 120) -> None:
        """Until the ready file names this process (one left by a process killed with -9 does not count)."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while not (self.ready.exists() and self.ready.read_text().split()[:1] == [str(self.proc.pid)]):
            assert self.proc.poll() is None, self.stderr()[-3000:]
            assert time.monotonic() < deadline, "no ready file: " + self.stderr()[-3000:]
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def stderr(self) -> str:
        return self.err.read_text(errors="replace") if self.err.exists() else ""

    def status(self, method: str, url: str, *headers: str) -> int:
        return raw_http(self.port, raw_request(method, url, *headers), timeout=30)[0]


def snapshot_of(site: Site) -> Path:
    return site.home / "catalog.json"


def serve_once(site: Site, tmp: Path) -> None:
    """A serve that loads its catalog from the ledger, so writes the snapshot, then stops."""
    r = Replica(site, free_port(), tmp / f"once{time.monotonic_ns()}").start()
    try:
        r.wait_ready()
    finally:
        r.stop()


# -- the snapshot itself ----------------------------------------------------------------------------


def test_the_snapshot_is_the_catalog_loaded_from_the_ledger(site, tmp_path):
    """What serve writes reads back as a Catalog equal to the one load_catalog builds (with --trust applied
    when read), holds the tokens' hashes and never a token; its size and read time are printed."""
    from frt.mirror.serve.catalog import load_catalog
    from frt.mirror.serve.snapshot import FORMAT, Snapshots
    from frt.mirror.store.home import Home
    from frt.mirror.store.records import change_serial

    serve_once(site, tmp_path)
    data = snapshot_of(site).read_bytes()
    doc = json.loads(data)
    home = Home(site.home, ledger_url=site.url)
    try:
        assert doc["format"] == FORMAT and doc["serial"] == change_serial(home.ledger)
        t0 = time.perf_counter()
        snap = Snapshots(home).read(frozenset({"someone"}))
        took = time.perf_counter() - t0
        assert snap.catalog == load_catalog(home, frozenset({"someone"}))
        assert snap.catalog.repos and snap.catalog.tokens and snap.catalog.publisher_trusted(ORG)
    finally:
        home.close()
    assert site.token.encode() not in data and len(doc["tokens"]) == 1 and len(doc["tokens"][0]) == 64
    print(f"snapshot: {len(data)} bytes, {len(site.files)} files, read and checked in {took * 1000:.1f} ms")


def test_on_an_object_store_the_snapshot_is_checked_against_one_listing(s3_staged, tmp_path, monkeypatch):
    """A replica with a home of its own over the bucket: its snapshot reads back equal, and a size or a
    blob the bucket does not hold is found from the store's listing (no request per blob)."""
    from frt.mirror.serve.catalog import load_catalog
    from frt.mirror.serve.snapshot import Snapshots, SnapshotUnusable
    from frt.mirror.store.home import Home
    from frt.mirror.store.records import change_serial

    for k, v in s3_staged["env"].items():
        monkeypatch.setenv(k, v)
    home = Home(tmp_path / "replica", ledger_url=s3_staged["ledger"], store_url=s3_staged["store"])
    try:
        snaps, catalog = Snapshots(home), load_catalog(home)
        snaps.write(catalog, change_serial(home.ledger))
        assert snaps.read().catalog == catalog and catalog.repos
        doc = json.loads(snaps.path.read_bytes())
        files = next(iter(doc["repos"][0]["commits"].values()))["files"]
        entry = next(iter(files.values()))
        for change, why in [
            ((0, entry[0] + 1), "bytes in the store s3://"),
            ((2, "0" * 64), "is not in the store s3://"),
        ]:
            edited = json.loads(json.dumps(doc))
            next(iter(next(iter(edited["repos"][0]["commits"].values()))["files"].values()))[change[0]] = change[1]
            snaps.path.write_text(json.dumps(edited))
            with pytest.raises(SnapshotUnusable, match=why):
                snaps.read()
    finally:
        home.close()


def test_a_serve_started_while_the_ledger_is_down_serves_the_snapshot_and_is_ready(site, pg_server, tmp_path):
    serve_once(site, tmp_path)
    r = Replica(site, free_port(), tmp_path / "r")
    with ledger_stopped(pg_server):
        r.start()
        try:
            r.wait_ready()
            f = site.files[0]
            assert r.status("GET", f.url, f"Authorization: Bearer {site.token}") == 200
            assert r.status("GET", f.url) == 401  # the tokens came with the catalog
        finally:
            r.stop()
    said = [ln for ln in r.stderr().splitlines() if "the ledger does not answer" in ln]
    assert len(said) == 1, r.stderr()
    print(said[0])
    assert f"from {snapshot_of(site)} until it does" in said[0] and "(serial " in said[0], said
    assert "Traceback" not in r.stderr()


def _refused(site: Site) -> str:
    p = run_cli_process("serve", "--port", str(free_port()), home=site.home, env=site.env(), timeout=120)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 3 and len(lines) == 1 and "ledger" in lines[0], p.stderr
    return lines[0]


def test_a_snapshot_that_cannot_be_used_is_one_line_and_exit_3(site, pg_server, tmp_path):
    """Missing, of another format, not JSON, naming a blob the store does not hold or holds at another size,
    or a blob gone from the store: serve does not start, and its one line says why."""
    serve_once(site, tmp_path)
    path = snapshot_of(site)
    good = path.read_bytes()
    doc = json.loads(good)
    repo = doc["repos"][0]
    commit = next(iter(repo["commits"].values()))
    name, (size, oid, sha, lfs) = next(iter(commit["files"].items()))

    def edited(change) -> bytes:
        d = json.loads(good)
        change(d, next(iter(d["repos"][0]["commits"].values()))["files"][name])
        return json.dumps(d).encode()

    cases = {
        "no catalog snapshot at": None,
        "is format 99; this serve reads format 1": edited(lambda d, f: d.update(format=99)),
        "is not a catalog snapshot": good[: len(good) // 2],
        f"does not match the store: {repo['id']}@": edited(lambda d, f: f.__setitem__(2, "0" * 64)),
        f"is {size} bytes in the store": edited(lambda d, f: f.__setitem__(0, size + 1)),
        "is of the ledger postgresql+psycopg://elsewhere/frt, not this serve's postgresql": edited(
            lambda d, f: d.update(ledger="postgresql+psycopg://elsewhere/frt")
        ),
    }
    blob = site.home / "store" / "sha256" / sha[:2] / sha
    with ledger_stopped(pg_server):
        try:
            for why, content in cases.items():
                path.unlink(missing_ok=True)
                if content is not None:
                    path.write_bytes(content)
                line = _refused(site)
                assert why in line and str(path) in line, (why, line)
            path.write_bytes(good)
            shutil.move(blob, tmp_path / "blob")
            try:
                line = _refused(site)
            finally:
                shutil.move(tmp_path / "blob", blob)
            assert f"(blob {sha[:12]}) is not in the store" in line, line
        finally:
            path.write_bytes(good)


# -- the test: a replica SIGKILLed and restarted during a PostgreSQL outage, under load ----------


def test_a_replica_restarted_during_a_postgresql_outage_under_load_fails_no_request(site, pg_server, tmp_path):
    """Two replicas behind nginx-conf's nginx, 64 keep-alive clients (HEAD + GET of every staged file, each
    answer and body checked). Halfway, PostgreSQL is stopped, one replica SIGKILLed and started again: it
    comes up from the snapshot (its ready file), takes traffic from nginx again, and no request fails.
    Then PostgreSQL starts, and a kernel staged then is served by the restarted replica within seconds."""
    public = Site(site.home, site.url, site.hub, "", site.files, site.tmp)
    p = run_cli("token", "revoke", "fleet", home=site.home, env=site.env())  # load.py's clients send none
    assert p.returncode == 0, p.stderr
    run = tmp_path / "nginx"
    run.mkdir()
    replicas = [Replica(public, free_port(), tmp_path / f"replica{i}", "--accel-redirect", PREFIX) for i in range(2)]
    for r in replicas:
        r.args += ("--access-log", str(r.where / "access.log"))
        r.start()
    events: list[tuple[str, float]] = []
    done = threading.Event()
    victim = replicas[1]

    def restart() -> None:
        t0 = time.monotonic()
        try:
            pg_server.stop()
            events.append(("postgresql stopped", time.monotonic() - t0))
            victim.stop()  # SIGKILL
            served_before = _lines(victim)
            victim.start()
            victim.wait_ready()
            events.append(("restarted replica ready", time.monotonic() - t0))
            deadline = time.monotonic() + 20  # until nginx sends it requests again (its mark runs out)
            while _lines(victim) <= served_before and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(1)
            events.append(("restarted replica served", time.monotonic() - t0))
        finally:
            done.set()

    worker = threading.Thread(target=restart)
    try:
        for r in replicas:
            r.wait_ready()
        conf = nginx_conf(site.home, [r.port for r in replicas], free_port(), run, env=site.env())
        with nginx(conf, run, []) as front:
            out = asyncio.run(load(front.port, site.files, clients=64, rounds=2, kill=worker.start, until=done.is_set))
            worker.join()
        print("events:", events, "requests:", out["total"], "after the kill:", out["after"])
        assert out["failures"] == [], out["failures"][:10]
        assert out["after"] > 0 and _lines(victim) > 0
        said = [ln for ln in victim.stderr().splitlines() if "serving the catalog of" in ln]
        assert len(said) == 1 and "the ledger does not answer" in said[0], victim.stderr()[-3000:]

        pg_server.start()
        new = hub_files(site.hub, public.stage({RELU: {"version": 1}}))[0]
        t0 = time.monotonic()
        while victim.status("HEAD", new.url) != 200:
            assert time.monotonic() - t0 < 30, victim.stderr()[-3000:]
            time.sleep(0.2)
        print(
            f"the restarted replica served a kernel staged after PostgreSQL came back in {time.monotonic() - t0:.1f} s"
        )
        assert "the ledger answers again" in victim.stderr()
        assert all("Traceback" not in r.stderr() for r in replicas)
    finally:
        done.set()
        if worker.is_alive():
            worker.join(timeout=180)
        pg_server.start()
        for r in replicas:
            r.stop()


def _lines(r: Replica) -> int:
    log = r.where / "access.log"
    return len(log.read_text(errors="replace").splitlines()) if log.exists() else 0
