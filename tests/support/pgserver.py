"""A real PostgreSQL server for the tests: Debian's `postgresql` binaries, one throwaway cluster in a
temporary directory, listening on 127.0.0.1 on a free port with `trust` auth, and a fresh database per test.

Why not the distribution's own cluster: a test must not depend on (or damage) a service on the machine,
and it must be able to stop, restart and crash the server mid-test. Why `nobody`: CI runs as root, and
initdb and postgres refuse to run as root; the cluster's files are owned by that user.

The binaries are looked up in /usr/lib/postgresql/<major>/bin (Debian keeps them off PATH), or in
$FRT_PG_BINDIR where a developer's PostgreSQL lives elsewhere.
"""

from __future__ import annotations

import atexit
import glob
import itertools
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

SUPERUSER = "postgres"
DEBIAN_BINDIRS = "/usr/lib/postgresql/*/bin"
INSTALL_HINT = (
    "PostgreSQL server binaries (initdb, postgres) not found in {where}: install Debian's "
    "`postgresql` package (apt-get install postgresql), or set FRT_PG_BINDIR to their directory"
)
# Settings for a disposable server: fsync buys nothing when the cluster is thrown away at the end of the
# session. synchronous_commit stays on: a commit still reaches the WAL file (the OS's page cache), so a
# crashed server (kill()) recovers every committed row, as a real one would.
TEST_SETTINGS = {"fsync": "off", "full_page_writes": "off", "listen_addresses": "127.0.0.1", "max_connections": "200"}

_live: set[PgServer] = set()


class PgUnavailable(RuntimeError):
    """No PostgreSQL to run here (binaries missing, no unprivileged user, an untraversable temp dir)."""


def find_bindir() -> Path:
    """The directory holding initdb and postgres; the newest Debian major version wins."""
    override = os.environ.get("FRT_PG_BINDIR")
    candidates = [override] if override else sorted(glob.glob(DEBIAN_BINDIRS), key=_major, reverse=True)
    for d in candidates:
        if all(os.access(Path(d, exe), os.X_OK) for exe in ("initdb", "postgres")):
            return Path(d)
    raise PgUnavailable(INSTALL_HINT.format(where=override or DEBIAN_BINDIRS))


def _major(bindir: str) -> int:
    name = Path(bindir).parent.name
    return int(name) if name.isdigit() else 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgServer:
    """One PostgreSQL cluster in a temporary directory. `start()` runs initdb on first use; `stop()`,
    `restart()` and `kill()` keep the data directory and the port, so URLs stay valid across them."""

    def __init__(self, bindir: Path | None = None, start_timeout: float = 60):
        self.bindir = bindir or find_bindir()
        self.start_timeout = start_timeout  # generous: the test machine has 2 busy cores
        self._user = _unprivileged_user()
        self.root = Path(tempfile.mkdtemp(prefix="frt-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self._names = itertools.count(1)
        self.url = ""  # the SQLAlchemy URL of the database created at first start
        _live.add(self)
        if self._user is not None:
            _check_traversable(self.root.parent)
            os.chown(self.root, self._user.pw_uid, self._user.pw_gid)

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> PgServer:
        """Start the server and wait until it accepts connections (initdb first, on first use)."""
        if self.running:
            return self
        if not self.data.exists():
            self._initdb()
        if self.port:
            self._spawn(self.port)  # a restart must keep its port: clients hold URLs naming it
        else:
            self._spawn_on_free_port()
        if not self.url:
            self.url = self.new_database()
        return self

    def stop(self, timeout: float = 30) -> None:
        """Fast shutdown (SIGINT): open sessions are cut, committed data is checkpointed."""
        self._signal_and_wait(signal.SIGINT, timeout)

    def kill(self, timeout: float = 30) -> None:
        """Immediate shutdown (SIGQUIT), as in a crash: no checkpoint, so the next start runs recovery.
        Not SIGKILL: orphaned backends would hold the shared memory and block the next start."""
        self._signal_and_wait(signal.SIGQUIT, timeout)

    def restart(self) -> PgServer:
        self.stop()
        return self.start()

    def close(self) -> None:
        """Stop the server and remove its directory; safe to call more than once."""
        try:
            self.stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
            _live.discard(self)

    def __enter__(self) -> PgServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # -- databases ---------------------------------------------------------------------------------
    def url_for(self, database: str) -> str:
        return f"postgresql+psycopg://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database; its SQLAlchemy URL. A copy of template1, which takes milliseconds."""
        name = f"t{os.getpid()}_{next(self._names)}"
        self.execute(f'CREATE DATABASE "{name}" TEMPLATE template1')
        return self.url_for(name)

    def drop_database(self, url: str) -> None:
        """Drop a database made by new_database, cutting any session still open on it."""
        name = url.rsplit("/", 1)[1]
        self.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def execute(self, sql: str, database: str = "postgres") -> None:
        """One statement outside a transaction (CREATE/DROP DATABASE cannot run inside one)."""
        with psycopg.connect(
            host="127.0.0.1", port=self.port, user=SUPERUSER, dbname=database, autocommit=True, connect_timeout=10
        ) as conn:
            conn.execute(sql)

    # -- internals ---------------------------------------------------------------------------------
    def _initdb(self) -> None:
        cmd = [
            str(self.bindir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            SUPERUSER,
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
            "--no-instructions",
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, **self._as_user())
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed ({done.returncode}): {done.stderr[-2000:]}")

    def _spawn_on_free_port(self, attempts: int = 5) -> None:
        # A free port can be taken between our probe and the server's bind; then try another one.
        for _ in range(attempts):
            try:
                return self._spawn(free_port())
            except _PortTaken:
                continue
        raise RuntimeError(f"PostgreSQL found no free port in {attempts} attempts: {self._log_tail()}")

    def _spawn(self, port: int) -> None:
        settings = {**TEST_SETTINGS, "port": str(port), "unix_socket_directories": str(self.root)}
        cmd = [str(self.bindir / "postgres"), "-D", str(self.data)]
        cmd += [arg for k, v in settings.items() for arg in ("-c", f"{k}={v}")]
        start = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, **self._as_user())
        self.port = port
        self._wait_ready(start)

    def _wait_ready(self, log_start: int) -> None:
        """Poll with a real connection until the server accepts one, the process dies, or time runs out."""
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self.proc.poll() is not None:
                tail = self._log_tail(log_start)
                if "Address already in use" in tail or "could not create any TCP/IP sockets" in tail:
                    raise _PortTaken(f"port {self.port} is taken by another process: {tail}")
                raise RuntimeError(f"postgres exited {self.proc.returncode} while starting: {tail}")
            try:
                psycopg.connect(
                    host="127.0.0.1", port=self.port, user=SUPERUSER, dbname="postgres", connect_timeout=2
                ).close()
                return
            except psycopg.OperationalError:
                pass
            if time.monotonic() > deadline:
                self._signal_and_wait(signal.SIGQUIT, 10)
                raise RuntimeError(
                    f"postgres did not accept connections in {self.start_timeout:.0f} s: {self._log_tail(log_start)}"
                )
            time.sleep(0.05)  # the polling interval, not a wait for the server

    def _signal_and_wait(self, sig: int, timeout: float) -> None:
        if not self.running:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def _as_user(self) -> dict:
        """Popen arguments that drop root to the unprivileged user (no supplementary groups)."""
        base = {"cwd": self.root, "env": {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}}
        if self._user is None:
            return base
        return {**base, "user": self._user.pw_uid, "group": self._user.pw_gid, "extra_groups": []}

    def _log_tail(self, start: int = 0) -> str:
        try:
            with open(self.log, "rb") as f:
                f.seek(start)
                return f.read().decode(errors="replace")[-2000:]
        except OSError:
            return "(no log)"


class _PortTaken(RuntimeError):
    pass


def _unprivileged_user() -> pwd.struct_passwd | None:
    """The user to run PostgreSQL as when we are root (`nobody`); None when we are not root."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        raise PgUnavailable("running as root and there is no `nobody` user to run PostgreSQL as") from None


def _check_traversable(path: Path) -> None:
    """`nobody` must be able to reach the cluster's directory: every ancestor needs o+x."""
    for p in [path, *path.parents]:
        if not p.stat().st_mode & stat.S_IXOTH:
            raise PgUnavailable(
                f"{p} is not traversable by other users, so PostgreSQL (run as nobody) "
                f"cannot reach its data directory; set TMPDIR to a directory like /tmp"
            )


@atexit.register
def _stop_all() -> None:
    for server in list(_live):
        server.close()
