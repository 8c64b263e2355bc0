"""nginx in front of two `frt-mirror serve --accel-redirect` replicas over one home, as
`frt-mirror nginx-conf` configures it: the real clients through it, its answers against serve's own,
a replica killed under load, and `serve --workers`. Also in the huggingface_hub 1.33 venv (marked
hub1).

nginx is the real one (Debian's /usr/sbin/nginx; .ci/run installs it), run by the fixture in the
foreground with its pid, logs and temp files in a temporary folder, and always stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.cli import cli_env, run_cli, run_cli_process
from tests.support.kernel_fixtures import ACTIVATION, LAYERNORM, X86_CPU
from tests.support.load import File, files_of, load
from tests.support.nginx import PREFIX, Front, answer, front_of, nginx, nginx_conf, nginx_t, wait_for_lines
from tests.support.serve_helpers import (
    LINE,
    CuttingProxy,
    children,
    free_port,
    raw_http,
    raw_request,
    replica_env,
    run_client,
)
from tests.support.serve_home import BIG, BIG_FILE, BIG_SIZE, SO, MiB10

pytestmark = pytest.mark.hub1

SMALL = f"build/{X86_CPU}/__init__.py"
META = f"build/{X86_CPU}/metadata.json"


@pytest.fixture(scope="module")
def front(serve_staged, tmp_path_factory):
    with front_of(serve_staged.home, tmp_path_factory.mktemp("nginx")) as f:
        yield f


def v1(staged, repo=ACTIVATION) -> str:
    return staged.repos[repo].branches["v1"]


# -- nginx-conf ------------------------------------------------------------------------------------


def test_nginx_conf_refuses_bad_input_in_one_line(serve_staged, tmp_path):
    cases = [
        (["--upstream", "nope"], "--upstream 'nope': expected HOST:PORT"),
        (["--upstream", "127.0.0.1:70000"], "--upstream '127.0.0.1:70000': expected HOST:PORT"),
        (["--listen", "a b:80"], "--listen 'a b:80': expected [HOST:]PORT"),
        (["--accel-redirect", "store"], "--accel-redirect 'store': expected a URL path"),
        (["--run-dir", str(tmp_path / "$x")], "cannot be written in an nginx config"),
        (["--user", "a;b"], "--user 'a;b': expected a user name"),
    ]
    for args, said in cases:
        p = run_cli("nginx-conf", *args, home=serve_staged.home)
        assert (p.returncode, p.stdout) == (2, ""), args
        assert len(p.stderr.splitlines()) == 1 and said in p.stderr, (args, p.stderr)
    p = run_cli("nginx-conf", home=tmp_path / "elsewhere")
    assert p.returncode == 2 and p.stderr.splitlines() == [
        f"frt-mirror: no blob store at {tmp_path}/elsewhere/store/sha256: --home must be the replicas' home, "
        "as this host mounts it"
    ]
    # In a process: a serve that did start would not return, and a process times out.
    p = run_cli_process("serve", "--port", str(free_port()), "--accel-redirect", "/a b", home=serve_staged.home)
    assert p.returncode == 2 and len(p.stderr.splitlines()) == 1 and "--accel-redirect" in p.stderr


def test_nginx_conf_defaults_and_nginx_accepts_it(serve_staged, tmp_path):
    """With no options: one replica at serve's default address, port 80, the default run dir; the file
    names each replica's command, and nginx's own check (`nginx -t`) passes on it."""
    p = run_cli("nginx-conf", home=serve_staged.home)
    assert p.returncode == 0, p.stderr
    conf = p.stdout
    # One replica: nginx always tries a single server, so it needs no backup line (see test_front_recovers…).
    assert "server 127.0.0.1:8470 max_fails=1 fail_timeout=5s;" in conf and "listen *:80;" in conf
    assert " backup " not in conf and "proxy_next_upstream_tries 2;" in conf
    # On the PostgreSQL ledger (FRT_LEDGER_URL: conftest.ledger_backend) the commands name it too.
    ledger = f" --ledger {os.environ['FRT_LEDGER_URL']}" if os.environ.get("FRT_LEDGER_URL") else ""
    assert (
        f"#   frt-mirror --home {serve_staged.home}{ledger} serve --host 127.0.0.1 --port 8470 "
        f"--accel-redirect {PREFIX}"
    ) in conf
    assert f'alias "{serve_staged.home}/store/sha256/";' in conf and "/var/lib/frt-mirror-nginx/" in conf
    conf = nginx_conf(serve_staged.home, [free_port(), free_port()], free_port(), tmp_path / "run")
    (tmp_path / "run").mkdir()  # as the file's first comment says
    t = nginx_t(conf, tmp_path)
    assert t.returncode == 0, t.stderr


# -- nginx's answers are serve's -------------------------------------------------------------------


def exchanges(staged) -> list[tuple[str, str, list[str], str]]:
    """(method, raw path, headers, who sends the body behind nginx: "nginx", "serve" or "none")."""
    act, big = staged.repos[ACTIVATION], staged.repos[BIG]
    so_etag = f'"{act.commits[v1(staged)].meta[SO].sha256}"'
    so = f"/kernels/{ACTIVATION}/resolve/v1/{SO}"
    enc = f"/kernels/{ACTIVATION}/resolve/refs%2Fheads%2Fv1/{SO}"
    small = f"/kernels/{ACTIVATION}/resolve/v1/{SMALL}"
    api = f"/api/kernels/{ACTIVATION}"
    out = [
        ("HEAD", so, [], "none"),
        ("GET", so, [], "nginx"),
        ("HEAD", enc, [], "none"),
        ("GET", enc, [], "nginx"),
        ("HEAD", small, [], "none"),
        ("GET", small, [], "nginx"),
        ("GET", f"/kernels/{ACTIVATION}/resolve/v1/{META}", [], "nginx"),
        ("GET", f"/kernels/{BIG}/resolve/release%2Fv1/{BIG_FILE}", [], "nginx"),
        ("HEAD", f"/kernels/{BIG}/resolve/v1/{BIG_FILE}", [], "none"),
        # Ranges nginx and serve read alike: nginx's range filter answers them.
        *[("GET", so, [f"Range: bytes={r}"], "nginx") for r in ("1000-", "10-19", "-5", "0-", "5-999999999")],
        ("GET", f"/kernels/{BIG}/resolve/v1/{BIG_FILE}", [f"Range: bytes={MiB10}-"], "nginx"),
        ("HEAD", so, ["Range: bytes=10-19"], "none"),
        # Ranges each would read its own way, and conditional requests: serve streams those itself.
        *[("GET", so, [f"Range: {r}"], "serve") for r in ("bytes = 10-19", "bytes=0-1,5-6", "Bytes=0-3")],
        ("GET", so, ["Range: bytes=999999999-"], "serve"),  # 416, by serve
        ("GET", so, [f"If-None-Match: {so_etag}"], "serve"),
        ("GET", so, ["If-Modified-Since: Sat, 01 Jan 2000 00:00:00 GMT"], "serve"),
        ("GET", so, ["If-Unmodified-Since: Sat, 01 Jan 2000 00:00:00 GMT"], "serve"),
        ("GET", so, ['If-Match: "other"'], "serve"),
        ("GET", so, ['If-Range: "other"', "Range: bytes=10-19"], "serve"),
        # Not files: proxied as they are.
        ("GET", f"{api}/revision/v1", [], "serve"),
        ("GET", f"{api}/tree/v1?recursive=true", [], "serve"),
        ("GET", f"{api}/refs", [], "serve"),
        ("GET", f"/api/kernels/{BIG}/commits/v1", [], "serve"),
        ("POST", f"{api}/paths-info/v1", ["Content-Type: application/x-www-form-urlencoded"], "serve"),
        ("GET", f"/kernels/{ACTIVATION}/resolve/v1/build/nope.py", [], "serve"),
        ("HEAD", f"/kernels/{ACTIVATION}/resolve/v9/{SO}", [], "none"),
        ("GET", f"/kernels/{ACTIVATION}/resolve/refs%2Fpr%2F1/{SO}", [], "serve"),
        ("GET", "/kernels/kernels-test/nope/resolve/v1/x", [], "serve"),
        ("GET", f"/api/organizations/{ACTIVATION.split('/')[0]}/overview", [], "serve"),
    ]
    assert big.branches["v1"]  # big's v1 and release/v1 are both staged
    return out


def test_answers_through_nginx_are_serves(serve_staged, serve_mirror, front):
    """Every answer nginx gives is, header for header and byte for byte, what serve alone gives; and
    the file bodies were sent by nginx, not by a replica (whose access log says how many it sent)."""
    cases = [
        (m, f"{p}{'&' if '?' in p else '?'}case={i}", h, who)  # a query routing ignores, to tell
        for i, (m, p, h, who) in enumerate(exchanges(serve_staged))
    ]  # the replicas' lines apart
    sizes = {}
    for method, path, headers, _ in cases:
        alone = answer(serve_mirror.port, method, path, headers)
        behind = answer(front.port, method, path, headers)
        assert behind[:2] == alone[:2], (method, path, headers)
        assert behind[2] == alone[2], (method, path, headers, len(behind[2]), len(alone[2]))
        assert "x-accel-redirect" not in dict(behind[1])
        sizes[path] = len(behind[2])
    sent = {ln["path"]: int(ln["bytes"]) for ln in wait_for_lines(front, lambda ln: "case=" in ln["path"], len(cases))}
    for method, path, headers, who in cases:
        want = sizes[path] if who == "serve" else 0  # "nginx": the replica sent headers only
        assert sent[path] == want, (method, path, headers, who)
    assert any(who == "nginx" and sizes[p] > 0 for _, p, _, who in cases)


def test_the_store_is_not_reachable_from_outside(serve_staged, front):
    """The internal location answers X-Accel-Redirect only; asked directly, it is not there."""
    sha256 = serve_staged.repos[ACTIVATION].commits[v1(serve_staged)].meta[SO].sha256
    for path in (f"{PREFIX}/{sha256[:2]}/{sha256}", f"{PREFIX}/", f"{PREFIX}/../store/sha256/{sha256[:2]}"):
        status, headers, _ = raw_http(front.port, raw_request("GET", path))
        assert status in (400, 404), (path, status)
        assert "x-repo-commit" not in headers


def test_a_replica_asked_directly_sends_the_bytes(serve_staged, front):
    """`--accel-redirect` redirects only what nginx forwards: a client at the replica gets the file."""
    body = serve_staged.repos[ACTIVATION].commits[v1(serve_staged)].files[SO]
    url = f"/kernels/{ACTIVATION}/resolve/v1/{SO}"
    for replica in front.replicas:
        status, headers, data = raw_http(replica.port, raw_request("GET", url))
        assert (status, data) == (200, body) and "x-accel-redirect" not in headers
        status, headers, data = raw_http(replica.port, raw_request("GET", url, "X-Sendfile-Type: X-Accel-Redirect"))
        assert (status, data, headers["content-length"]) == (200, b"", "0")
        assert headers["x-accel-redirect"] == f"{PREFIX}/{headers['etag'][1:3]}/{headers['etag'][1:-1]}"


def test_head_cache_answers_repeated_heads_by_sha_as_serve(serve_staged, serve_mirror, tmp_path):
    """`nginx-conf --head-cache`: a HEAD of a file by commit sha is answered by nginx from its cache the
    second time, header for header as serve answers it; a HEAD by branch, with a Range, a condition or a
    token, and every GET, still reaches a replica each time."""
    sha = v1(serve_staged)
    meta = serve_staged.repos[ACTIVATION].commits[sha].meta
    etag = f'"{meta[SO].sha256}"'
    by_sha = [f"/kernels/{ACTIVATION}/resolve/{sha}/{p}" for p in (SO, SMALL)]
    uncached = [
        ("HEAD", f"/kernels/{ACTIVATION}/resolve/v1/{SO}", []),
        ("HEAD", by_sha[0], ["Range: bytes=10-19"]),
        ("HEAD", by_sha[0], [f"If-None-Match: {etag}"]),
        ("HEAD", by_sha[0], ["Authorization: Bearer x"]),
        ("GET", by_sha[0], []),
    ]
    with front_of(serve_staged.home, tmp_path / "nginx", conf_args=("--head-cache", "60")) as front:
        for path in by_sha:
            alone = answer(serve_mirror.port, "HEAD", path, [])
            assert [answer(front.port, "HEAD", path, []) for _ in range(3)] == [alone] * 3, path
        for method, path, headers in uncached:
            alone = answer(serve_mirror.port, method, path, headers)
            assert [answer(front.port, method, path, headers) for _ in range(2)] == [alone] * 2
        want = len(by_sha) + 2 * len(uncached)
        lines = wait_for_lines(front, lambda ln: "/resolve/" in ln["path"], want)
    assert sorted((ln["method"], ln["path"]) for ln in lines) == sorted(
        [("HEAD", p) for p in by_sha] + [(m, p) for m, p, _ in uncached for _ in range(2)]
    )


# -- real clients through nginx --------------------------------------------------------------------


def test_get_kernel_through_nginx(serve_staged, front, tmp_path):
    p, out = run_client(
        f"""
        import os, kernels
        ln = kernels.get_kernel({LAYERNORM!r}, version=1)   # kernel-depends: activation v2
        a1 = kernels.get_kernel({ACTIVATION!r}, version=1)
        report({{"ln": [ln.VARIANT, ln.REVISION_NOTE, ln.add(2, 3)], "a1": [a1.VARIANT, a1.REVISION_NOTE]}})
    """,
        front.url,
        tmp_path / "hf",
    )
    assert out == {"ln": [X86_CPU, "initial", 5], "a1": [X86_CPU, "cu-rebuild"]}, p.stderr[-3000:]
    assert "trust_remote_code" not in p.stderr


def test_snapshot_download_through_nginx(serve_staged, front, tmp_path):
    p, out = run_client(
        f"""
        import os
        from huggingface_hub import snapshot_download
        files = tree_sha256
        act = snapshot_download({ACTIVATION!r}, repo_type="kernel", revision="v1")
        big = snapshot_download({BIG!r}, repo_type="kernel", revision="release/v1")
        report({{"act": [os.path.basename(act), files(act)], "big": [os.path.basename(big), files(big)]}})
    """,
        front.url,
        tmp_path / "hf",
    )
    assert out is not None, p.stderr[-3000:]
    for key, repo, rev in (("act", ACTIVATION, "v1"), ("big", BIG, "release/v1")):
        commit = serve_staged.repos[repo].commits[serve_staged.repos[repo].branches[rev]]
        sha, files = out[key]
        staged_files = {p for p in commit.files if key == "big" or p.startswith(f"build/{X86_CPU}/")}
        assert sha == commit.sha
        assert files == {p: hashlib.sha256(commit.files[p]).hexdigest() for p in staged_files}
    assert BIG_FILE in out["big"][1]


def test_dropped_download_resumes_with_range_through_nginx(serve_staged, front, tmp_path):
    """A download cut mid-body is resumed with a Range GET that nginx answers (a 206 from the store)."""
    big = serve_staged.repos[BIG]
    cut_path = f"/kernels/{BIG}/resolve/v1/{BIG_FILE}"
    with CuttingProxy(front.port, cut_path, cut_after=16 << 20) as proxy:
        p, out = run_client(
            f"""
            from huggingface_hub import hf_hub_download
            report(sha256_of(hf_hub_download({BIG!r}, {BIG_FILE!r}, repo_type="kernel", revision="v1")))
        """,
            proxy.url,
            tmp_path / "hf",
        )
        gets = [e for e in proxy.exchanges if e.method == "GET" and e.path == cut_path]
    assert out == big.commits[big.branches["v1"]].meta[BIG_FILE].sha256, p.stderr[-3000:]
    assert proxy.cuts == 1 and len(gets) == 2
    first, resumed = gets
    assert first.status == 200 and resumed.headers["range"] == f"bytes={MiB10}-" and resumed.status == 206
    assert resumed.response_headers["content-range"] == f"bytes {MiB10}-{BIG_SIZE - 1}/{BIG_SIZE}"
    # Both bodies came from nginx: the replicas answered those GETs with headers only.
    lines = wait_for_lines(front, lambda ln: ln["method"] == "GET" and ln["path"] == cut_path, 2)
    assert [int(ln["bytes"]) for ln in lines] == [0, 0] and {ln["status"] for ln in lines} == {"200"}


# -- a replica killed under load -------------------------------------------------------------------


def staged_files(staged) -> list[File]:
    """Every file staged, as a client asks for it (by commit), with what it must get back."""
    return files_of(lambda repo_id: staged.repos[repo_id], staged.rows)


@pytest.mark.parametrize(
    ("head_map", "stop"),
    [(False, "SIGKILL"), (True, "SIGKILL"), (False, "SIGTERM")],
    ids=["plain", "head-map", "graceful"],
)
def test_a_replica_killed_under_load_fails_no_request(serve_staged, tmp_path, head_map, stop):
    """64 clients over loopback, HEAD + GET of every staged file; one of the two replicas is killed
    (SIGKILL) halfway: no request fails and every body has the right bytes. With --head-map too (nginx
    answers the HEADs, the replicas the GETs; the one killed was writing the map as well). Or stopped
    with SIGTERM (a graceful restart's first half): it finishes the answers in flight, closes its idle
    keep-alive connections, and nginx sends what comes after to the other: none fails either."""
    files = [f for f in staged_files(serve_staged) if f.size < BIG_SIZE]  # the 24 MiB file: once per client
    big = [f for f in staged_files(serve_staged) if f.size == BIG_SIZE]
    assert len(files) >= 8 and big
    run = tmp_path / "nginx"
    mapped = {"conf_args": ("--head-map",), "serve_args": ("--head-map", str(run))} if head_map else {}
    with front_of(serve_staged.home, run, **mapped) as front:
        victim = front.replicas[0]
        kill = victim.proc.kill if stop == "SIGKILL" else victim.proc.terminate
        out = asyncio.run(load(front.port, files + big[:1], clients=64, rounds=2, kill=kill))
        assert victim.proc.wait(timeout=30) == (-signal.SIGKILL if stop == "SIGKILL" else 0), victim.proc.returncode
        survivor = front.replicas[1]
        assert survivor.proc.poll() is None
        served = [len(ln) for ln in (replica_lines_of(front, 0), replica_lines_of(front, 1))]
        errors = front.error_log()
    assert out["failures"] == [], out["failures"][:10]
    assert out["total"] == 64 * 2 * len(files + big[:1]) * 2 and out["after"] > 0
    assert served[0] > 0 and served[1] > 0  # both replicas took requests before the kill
    if stop == "SIGKILL":
        assert "upstream" in errors  # nginx did meet the dead replica, and went on to the other


def test_graceful_restarts_lose_nothing_for_a_direct_client_that_retries(serve_staged, tmp_path):
    """One replica, no nginx in front: 16 threads of keep-alive clients (urllib3) with the retries a
    client sets for idempotent requests (connect and read errors, with backoff), every GET's bytes checked.
    The replica is stopped with SIGTERM three times under them and started again by a supervisor once it
    exits, which counts it up only when its --ready-file is written (serve listens only then). Each stop
    finishes the answers in flight and closes idle keep-alive connections, as HTTP/1.1 lets a server; a
    request that met a closed connection, or the port closed while the replica restarted, is retried:
    every answer arrives whole and right, none is lost, and every stop exits 0."""
    import threading

    import urllib3
    from urllib3.util.retry import Retry

    files = [f for f in staged_files(serve_staged) if f.size < BIG_SIZE]
    port, ready = free_port(), tmp_path / "ready"
    exe = str(Path(sys.executable).with_name("frt-mirror"))
    argv = [exe, "--home", str(serve_staged.home), "serve", "--port", str(port), "--ready-file", str(ready)]
    procs: list[subprocess.Popen] = []
    state = {"stopping": False}

    def supervise() -> None:
        while not state["stopping"]:
            with open(tmp_path / "serve.log", "ab") as err:
                procs.append(subprocess.Popen(argv, env=replica_env(), stdout=subprocess.DEVNULL, stderr=err))
            procs[-1].wait()

    def up(n: int) -> None:
        poll(lambda: len(procs) == n and ready.exists() and procs[-1].poll() is None, f"replica {n} ready")

    failures: list = []
    answered = [0]
    done = threading.Event()

    def client(i: int) -> None:
        retry = Retry(total=40, connect=40, read=40, status=0, backoff_factor=0.05, backoff_max=0.5)
        pool = urllib3.PoolManager(maxsize=1, retries=retry)
        j = i
        while not done.is_set():
            f = files[j % len(files)]
            j += 1
            try:
                r = pool.request("GET", f"http://127.0.0.1:{port}{f.url}")
                if r.status != 200 or hashlib.sha256(r.data).hexdigest() != f.sha256:
                    failures.append((f.url, r.status))
                answered[0] += 1
            except urllib3.exceptions.HTTPError as e:
                failures.append((f.url, repr(e)))

    supervisor = threading.Thread(target=supervise, daemon=True)
    supervisor.start()
    up(1)
    clients = [threading.Thread(target=client, args=(i,)) for i in range(16)]
    for c in clients:
        c.start()
    try:
        for n in range(1, 4):
            time.sleep(1.5)
            ready.unlink()  # serve removes it as it stops; gone first, so up() waits for the next one
            procs[-1].send_signal(signal.SIGTERM)
            up(n + 1)
        time.sleep(1.5)
    finally:
        done.set()
        for c in clients:
            c.join(timeout=60)
        state["stopping"] = True
        procs[-1].send_signal(signal.SIGTERM)
        supervisor.join(timeout=30)
    log = (tmp_path / "serve.log").read_text(errors="replace")
    assert failures == [], failures[:10]
    assert answered[0] > 100, answered
    assert [p.returncode for p in procs] == [0, 0, 0, 0], log[-3000:]
    assert log.count("stopped on SIGTERM") == 4, log[-3000:]


def replica_lines_of(front: Front, i: int) -> list[str]:
    log = front.run / f"replica{i}.log"
    return [ln for ln in log.read_text(errors="replace").splitlines() if LINE.fullmatch(ln)]


# -- every replica down, then one back -------------------------------------------------------------


def replica_at(home: Path, port: int, err: Path) -> subprocess.Popen:
    """A replica as nginx-conf's comments say to run it, on a port of the caller's (to be started again
    on it), answering directly once this returns."""
    exe = str(Path(sys.executable).with_name("frt-mirror"))
    with open(err, "ab") as e:
        proc = subprocess.Popen(
            [exe, "--home", str(home), "serve", "--port", str(port), "--accel-redirect", PREFIX],
            stdout=subprocess.DEVNULL,
            stderr=e,
            env=replica_env(),
        )
    poll(lambda: proc.poll() is not None or _get(port, "/api/agent-harnesses") == 404, "the replica")
    assert proc.poll() is None, err.read_text()
    return proc


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=30)


def _get(port: int, path: str) -> int:
    try:
        return raw_http(port, raw_request("GET", path), timeout=10)[0]
    except OSError:
        return 0


def test_front_recovers_at_once_when_a_replica_comes_back_after_all_were_down(serve_staged, tmp_path):
    """Both replicas stopped, nginx marks each failed (its 502s); one started again: the next request through
    nginx is answered by it, within 1 s. With `max_fails=1 fail_timeout=5s` alone nginx answered 502 until a
    mark ran out, up to 5 s after the replica was back (a replica starts in less here: the marks are
    still on when it answers). Before that, one replica down and one up: every request is answered."""
    run, api = tmp_path / "nginx", f"/api/kernels/{ACTIVATION}/revision/v1"
    ports = [free_port(), free_port()]
    procs = [replica_at(serve_staged.home, p, tmp_path / f"replica{i}.err") for i, p in enumerate(ports)]
    try:
        conf = nginx_conf(serve_staged.home, ports, free_port(), run)
        assert conf.count(" backup max_fails=0;") == 2 and "proxy_next_upstream_tries 4;" in conf
        with nginx(conf, run, []) as front:
            stop(procs[0])
            assert [_get(front.port, api) for _ in range(30)] == [200] * 30  # what max_fails=1 is for: kept
            stop(procs[1])
            # New connections, so that each of nginx's workers (each keeps its own marks) meets both dead.
            assert [_get(front.port, api) for _ in range(12)] == [502] * 12
            down = time.monotonic()
            procs[0] = replica_at(serve_staged.home, ports[0], tmp_path / "replica0.err")
            back = time.monotonic()
            status = _get(front.port, api)
            took = time.monotonic() - back
            assert status == 200 and took < 1, (status, took, front.error_log()[-2000:])
            assert [_get(front.port, api) for _ in range(20)] == [200] * 20
        assert back - down < 5, "the replica started after nginx's marks ran out: this proved nothing"
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


# -- serve --workers -------------------------------------------------------------------------------


def listening_inode(port: int) -> str | None:
    """The inode of the socket listening on 127.0.0.1:port (state 0A in /proc/net/tcp)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == f"0100007F:{port:04X}" and fields[3] == "0A":
            return fields[9]
    return None


def holds(pid: int, inode: str) -> bool:
    with contextlib.suppress(OSError):
        return any(os.readlink(fd) == f"socket:[{inode}]" for fd in Path(f"/proc/{pid}/fd").iterdir())
    return False


def poll(cond, what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while not (value := cond()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return value


@pytest.mark.parametrize("stop", ["SIGTERM", "Ctrl-C", "parent killed"])
def test_serve_workers_share_the_port_and_stop_together(serve_staged, tmp_path, stop):
    port, log = free_port(), tmp_path / "access.log"
    exe = str(Path(sys.executable).with_name("frt-mirror"))
    with open(tmp_path / "stderr", "wb") as err:
        # Its own session, as a terminal's foreground job is: Ctrl-C is SIGINT to the whole group.
        proc = subprocess.Popen(
            [
                exe,
                "--home",
                str(serve_staged.home),
                "serve",
                "--port",
                str(port),
                "--workers",
                "2",
                "--access-log",
                str(log),
            ],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=cli_env(),
            start_new_session=True,
        )
    try:
        inode = poll(lambda: listening_inode(port), "the socket")
        workers = poll(lambda: workers_on(proc.pid, inode), "two workers on the socket")
        url = f"/kernels/{ACTIVATION}/resolve/v1/{SO}"
        poll(lambda: _head(port, url) == 200, "an answer")
        os.kill(workers[0], signal.SIGKILL)  # uvicorn's supervisor starts another in its place
        replaced = poll(lambda: (w := workers_on(proc.pid, inode)) and workers[0] not in w and w, "a new worker")
        assert all(_head(port, url) == 200 for _ in range(50))
        if stop == "SIGTERM":
            proc.send_signal(signal.SIGTERM)
        elif stop == "Ctrl-C":
            os.killpg(proc.pid, signal.SIGINT)
        else:  # the workers must not go on holding the port on their own
            proc.kill()
        want = -signal.SIGKILL if stop == "parent killed" else 0
        assert proc.wait(timeout=60) == want, (tmp_path / "stderr").read_text()
        poll(lambda: not any(Path(f"/proc/{p}").exists() for p in replaced), "the workers to exit")
        assert listening_inode(port) is None
    finally:  # the whole group: workers left behind by a failed check included
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    stderr = (tmp_path / "stderr").read_text()
    assert stderr.splitlines()[0].startswith(
        f"frt-mirror: serving {serve_staged.home} on http://127.0.0.1:{port}, 2 workers"
    ), stderr
    assert f"frt-mirror: worker {workers[0]} was killed by SIGKILL; starting another" in stderr.splitlines()
    assert "Traceback" not in stderr
    heads = [ln for ln in log.read_text().splitlines() if (m := LINE.fullmatch(ln)) and m["method"] == "HEAD"]
    # The 50 HEADs after the kill reach the log, the last lines as each worker shuts down (the killed
    # worker's last line may be lost with it).
    assert len(heads) >= 50


def workers_on(pid: int, inode: str, n: int = 2) -> list[int] | None:
    """serve's `n` workers, once there are `n` and each holds the listening socket."""
    w = children(pid)
    return w if len(w) == n and all(holds(p, inode) for p in w) else None


def _head(port: int, url: str) -> int:
    try:
        return raw_http(port, raw_request("HEAD", url), timeout=10)[0]
    except OSError:
        return 0
