"""Soak: a site for minutes under faults, counting failed requests and wrong bytes, watching each replica.

    python -m bench.soak [--minutes N] [--clients C] [--json]

Two `frt-mirror serve` replicas on one home and one PostgreSQL ledger, with pull-through on (`--upstream`
the fake Hub, `--allow` its org), behind nginx as `frt-mirror nginx-conf` writes it; C keep-alive clients
(default 64) through nginx, each asking HEAD then GET of every file in turn, every answer checked (status,
X-Repo-Commit, ETag, length, the body's sha256: tests/support/load.py), for N minutes (default 10, at most
60). The files: the kernels staged into the home, and a kernel that only pull-through brings (pulled once
by the warm-up, which runs before any fault).

The faults, from the end of the warm-up:
- every 60 s the ledger's PostgreSQL stops for 10 s;
- every 90 s (from 5 s in) a replica is stopped, SIGKILL and SIGTERM in turn, the two replicas in turn:
  every other stop lands in a ledger outage, so the replica starts again while the ledger is down;
- every 60 s (30 s after each ledger stop) the upstream answers 429 for a 15 s window (its rate limit
  set to one request per window).
The supervisor restarts a replica only when it exits (as systemd's `Restart=always` does) and counts it up
only once its `--ready-file` is written; serve listens only once it can answer, so nginx, which sends
traffic wherever a connect succeeds, never sends any to a replica that is not ready.

Printed: requests, failed requests, wrong bytes, a few of the failures; per replica, its restarts and
RSS, open fds and threads at start (20 s into the full load) and at the end (its last sample under the
load); and, since every replica process is replaced within three minutes, the largest growth of RSS, fds
and threads within one process's life, from 20 s after it was ready under the load to its last sample.
The fds leave out the connections nginx holds to the replica: they follow the load (more to one replica
while the other restarts), up to nginx-conf's `keepalive`, whatever the replica does. Targets: 0 failed,
0 wrong, RSS growth <= 10%, fds and threads flat: within +4 fds and +2 threads (anyio's and asyncio's
worker threads start on demand, anyio's end after 10 s idle), where a leak grows without bound. The exit
status is 0 only where all of them hold.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.cli import EXE, X86, cli_env, run_cli_process, write_manifest
from tests.support.fakehub import FakeHub
from tests.support.fakehub.ratelimit import RateLimits
from tests.support.kernel_fixtures import ACTIVATION, LAYERNORM, ORG, RELU, demo_repos
from tests.support.load import Client, File, hub_files
from tests.support.nginx import PREFIX, nginx, nginx_conf
from tests.support.pgserver import PgServer
from tests.support.serve_helpers import free_port

WARM_S = 20  # a process's figures are taken from this long after it was ready
SAMPLE_S = 5
LEDGER_EVERY, LEDGER_DOWN = 60, 10
REPLICA_AT, REPLICA_EVERY = 5, 90  # 5 s past a minute: every other one lands in a ledger outage
FDS_SLACK, THREADS_SLACK = 4, 2  # what "flat" allows: see the module's docstring
QUOTA_AT, QUOTA_WINDOW = 30, 15


def served_sockets(port: int) -> set[str]:
    """The inodes of the sockets on local `port`: the listener and the connections it accepted."""
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port:
                    out.add(fields[9])
    return out


def proc_figures(pid: int, port: int) -> tuple[int, int, int] | None:
    """(RSS bytes, open fds besides the connections nginx opened to it, threads) of a live process; None
    once it is gone. Connections are left out: nginx keeps up to its `keepalive` idle ones per worker to
    each replica, more to one while the other restarts, so they follow the load, not the replica."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    except OSError:
        return None
    served = served_sockets(port)
    fds = sum(1 for link in links if not (link.startswith("socket:[") and link[8:-1] in served))
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) * 1024, fds + 1, int(fields["Threads"])  # + the listener


@dataclass
class Life:
    """One replica process: when it was ready, and its first warm sample and its last sample."""

    pid: int
    ready_at: float | None = None
    warm: tuple[int, int, int] | None = None
    last: tuple[int, int, int] | None = None


@dataclass
class Replica:
    """One replica slot and its supervisor: start, wait for readiness, restart when it exits."""

    index: int
    port: int
    argv: list[str]
    env: dict[str, str]
    ready_file: Path
    log: Path
    lives: list[Life] = field(default_factory=list)
    exits: list[int] = field(default_factory=list)
    stopping: bool = False
    proc: subprocess.Popen | None = None

    def supervise(self) -> None:
        while not self.stopping:
            self.ready_file.unlink(missing_ok=True)
            with open(self.log, "ab") as err:
                self.proc = subprocess.Popen(self.argv, env=self.env, stdout=subprocess.DEVNULL, stderr=err)
            life = Life(self.proc.pid)
            self.lives.append(life)
            while self.proc.poll() is None and life.ready_at is None:
                if self.ready_file.exists():
                    life.ready_at = time.monotonic()
                time.sleep(0.05)
            self.exits.append(self.proc.wait())
            if not self.stopping:
                time.sleep(0.5)  # systemd's RestartSec, short

    def sample(self, load_since: float) -> None:
        """Under the full load only (its connections are a replica's fds too): warm once the load and the
        process have both run WARM_S."""
        life = self.lives[-1] if self.lives else None
        if life is None or life.ready_at is None or (figures := proc_figures(life.pid, self.port)) is None:
            return
        life.last = figures
        if life.warm is None and time.monotonic() - max(life.ready_at, load_since) >= WARM_S:
            life.warm = figures

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)


def stage_site(tmp: Path, hub: FakeHub, ledger: str) -> tuple[Path, list[File]]:
    """The home, staged on the ledger; the files clients ask: the staged kernels' and layernorm's, which
    pull-through brings (its rows from a stage into a scratch home, for their commits and variants)."""
    home, files = tmp / "home", []
    for name, kernels, env in (
        ("site", {ACTIVATION: {"version": 1}, RELU: {"version": 1}}, cli_env(FRT_LEDGER_URL=ledger)),
        ("pulled", {LAYERNORM: {"version": 1}}, cli_env()),
    ):
        m = write_manifest(tmp / f"{name}.toml", kernels, [X86], trust=[ORG])
        where = home if name == "site" else tmp / "scratch"
        p = run_cli_process("--endpoint", hub.url, "stage", str(m), "--json", home=where, env=env, timeout=600)
        if p.returncode:
            sys.exit(f"bench.soak: stage failed: {p.stderr}")
        rows = json.loads(p.stdout)["rows"]
        files += hub_files(hub, [r for r in rows if r["repo"] != ACTIVATION or name == "site"])
    return home, files


async def clients(port: int, files: list[File], n: int, until: float, failures: list) -> int:
    pool = [Client(port, failures) for _ in range(n)]

    async def run(i: int, c: Client) -> None:
        j = i
        while time.monotonic() < until:
            f = files[j % len(files)]
            await c.ask("HEAD", f)
            await c.ask("GET", f)
            j += 1
        c.close()

    await asyncio.gather(*(run(i, c) for i, c in enumerate(pool)))
    return sum(c.done for c in pool)


def faults(seconds: float, pg: PgServer, hub: FakeHub, replicas: list[Replica], said: list[str]) -> None:
    """The schedule above, from now for `seconds`; each fault one line in `said`."""
    t0 = time.monotonic()
    events = []
    for k in range(1, int(seconds // LEDGER_EVERY) + 1):
        events += [(k * LEDGER_EVERY, "ledger down"), (k * LEDGER_EVERY + LEDGER_DOWN, "ledger up")]
    for k in range(int((seconds - QUOTA_AT) // LEDGER_EVERY) + 1):
        at = QUOTA_AT + k * LEDGER_EVERY
        events += [(at, "quota on"), (at + QUOTA_WINDOW, "quota off")]
    for k in range(int((seconds - REPLICA_AT) // REPLICA_EVERY) + 1):
        events.append((REPLICA_AT + k * REPLICA_EVERY, f"replica {k % 2} {'SIGTERM' if k % 2 else 'SIGKILL'}"))
    for at, what in sorted(e for e in events if e[0] < seconds):
        time.sleep(max(0.0, t0 + at - time.monotonic()))
        said.append(f"{at:>4}s {what}")
        if what == "ledger down":
            pg.stop()
        elif what == "ledger up":
            pg.start()
        elif what == "quota on":
            hub.rate_limits = RateLimits(api=1, resolvers=1, window=QUOTA_WINDOW)
        elif what == "quota off":
            hub.rate_limits = None
        else:
            _, i, sig = what.split()
            replicas[int(i)].signal(getattr(signal, sig))
    if not pg.running:
        pg.start()
    hub.rate_limits = None


def growth(lives: list[Life]) -> tuple[float, int, int]:
    """The largest growth within one process's life, warm sample to last: RSS as a fraction, fds, threads."""
    rss, fds, threads = 0.0, 0, 0
    for life in lives:
        if life.warm and life.last:
            rss = max(rss, life.last[0] / life.warm[0] - 1)
            fds, threads = max(fds, life.last[1] - life.warm[1]), max(threads, life.last[2] - life.warm[2])
    return rss, fds, threads


def soak(minutes: float, n_clients: int) -> dict:
    seconds = minutes * 60
    with (
        tempfile.TemporaryDirectory(prefix="frt-soak-") as td,
        PgServer() as pg,
        FakeHub(demo_repos(), trusted_orgs=[ORG], page_size=5) as hub,
    ):
        tmp = Path(td)
        ledger = pg.new_database()
        home, files = stage_site(tmp, hub, ledger)
        env = cli_env(FRT_LEDGER_URL=ledger, PYTHONWARNINGS="ignore")
        run, ports = tmp / "nginx", [free_port(), free_port()]
        replicas = [
            Replica(
                i,
                port,
                [EXE, "--home", str(home), "serve", "--port", str(port), "--accel-redirect", PREFIX, "--access-log",
                 os.devnull, "--ready-file", str(tmp / f"replica{i}.ready"), "--upstream", hub.url, "--allow", ORG],
                env,
                tmp / f"replica{i}.ready",
                tmp / f"replica{i}.log",
            )
            for i, port in enumerate(ports)
        ]  # fmt: skip
        threads = [threading.Thread(target=r.supervise, daemon=True) for r in replicas]
        for t in threads:
            t.start()
        conf = nginx_conf(home, ports, free_port(), run, env=env)
        out: dict = {"minutes": minutes, "clients": n_clients, "files": len(files)}
        with nginx(conf, run, []) as front:
            warm: list = []
            asyncio.run(clients(front.port, files, 8, time.monotonic() + WARM_S, warm))  # pulls layernorm once
            if warm:
                sys.exit(f"bench.soak: the warm-up failed before any fault: {warm[:5]}")
            said: list[str] = []
            stop_sampling = threading.Event()
            t0 = time.monotonic()

            def sampler() -> None:
                while not stop_sampling.wait(SAMPLE_S):
                    for r in replicas:
                        r.sample(t0)

            threading.Thread(target=sampler, daemon=True).start()
            injector = threading.Thread(target=faults, args=(seconds, pg, hub, replicas, said), daemon=True)
            injector.start()
            failures: list = []
            requests = asyncio.run(clients(front.port, files, n_clients, t0 + seconds, failures))
            stop_sampling.set()
            injector.join(timeout=60)
            start = [next((life.warm for life in r.lives if life.warm), None) for r in replicas]
            end = [r.lives[-1].last for r in replicas]
            errors = front.error_log()
        for r in replicas:
            r.stopping = True
            r.signal(signal.SIGTERM)
        for t in threads:
            t.join(timeout=30)
    wrong = sum(1 for f in failures if f[2] == "wrong bytes")
    rss, fds, thr = growth([life for r in replicas for life in r.lives])
    out.update(
        requests=requests,
        failed=len(failures) - wrong,
        wrong=wrong,
        examples=[list(map(str, f)) for f in failures[:10]],
        faults=said,
        replicas=[
            {"restarts": len(r.lives) - 1, "exits": r.exits[:-1], "start": s, "end": e}
            for r, s, e in zip(replicas, start, end, strict=True)
        ],
        growth={"rss": rss, "fds": fds, "threads": thr},
        nginx_upstream_errors=errors.count("upstream"),
    )
    out["ok"] = not failures and rss <= 0.10 and fds <= FDS_SLACK and thr <= THREADS_SLACK
    return out


def render(r: dict) -> str:
    mib = 1 << 20
    lines = [
        f"soak: {r['minutes']:g} min, {r['clients']} clients through nginx, 2 replicas, PostgreSQL ledger, "
        f"pull-through on; {r['files']} files",
        *(f"  {line}" for line in r["faults"]),
        f"requests {r['requests']}   failed {r['failed']}   wrong bytes {r['wrong']}",
        *(f"  e.g. {' '.join(e)}" for e in r["examples"]),
        "replica  restarts  RSS start/end (MiB)  fds start/end (not nginx's)  threads start/end",
    ]
    for i, rep in enumerate(r["replicas"]):
        s, e = rep["start"] or (0, 0, 0), rep["end"] or (0, 0, 0)
        lines.append(
            f"{i:>7}  {rep['restarts']:>8}  {s[0] / mib:>8.1f} / {e[0] / mib:<8.1f}  {s[1]:>6} / {e[1]:<6}"
            f"  {s[2]:>7} / {e[2]}"
        )
    g = r["growth"]
    lines.append(
        f"within one process's life (from {WARM_S} s after ready): RSS {g['rss']:+.1%} (target <= +10%), "
        f"fds {g['fds']:+d}, threads {g['threads']:+d} (target: flat, within +{FDS_SLACK} and +{THREADS_SLACK})"
    )
    lines.append("ok" if r["ok"] else "NOT MET")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not 0 < args.minutes <= 60:
        ap.error("--minutes: more than 0, at most 60")
    result = soak(args.minutes, args.clients)
    print(json.dumps(result) if args.json else render(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
