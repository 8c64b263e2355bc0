"""`GET /metrics`: Prometheus text, parsed with prometheus_client's own parser, from a running serve
(one process, and `--workers 2`, where a scrape lands on either worker and must still count both);
the counters rise after a real client's download. And the pieces: route names, observe_pull."""

from __future__ import annotations

import json
import textwrap
import time

import pytest

from tests.support.cli import run_cli, write_manifest
from tests.support.fakehub import FakeHub
from tests.support.kernel_fixtures import ACTIVATION, ORG, RELU, demo_repos
from tests.support.serve_helpers import children, raw_http, raw_request, replica_env, run_client, serving

X86 = "torch2.13-cpu-x86_64-linux"
DOWNLOAD = """
    from huggingface_hub import hf_hub_download
    p = hf_hub_download({repo!r}, {path!r}, revision="v1", repo_type="kernel")
    report({{"size": __import__("os").path.getsize(p)}})
"""


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("metrics")
    with FakeHub(demo_repos(), trusted_orgs=[ORG], page_size=5) as hub:
        manifest = write_manifest(
            tmp / "m.toml", {ACTIVATION: {"version": 1}, RELU: {"version": 1}}, [X86], trust=[ORG]
        )
        p = run_cli("--endpoint", hub.url, "stage", str(manifest), "--json", home=tmp / "home")
        assert p.returncode == 0, p.stderr
    return tmp / "home"


def scrape(port: int) -> dict[str, list]:
    """{metric family name: [(sample name, labels, value)]}, through prometheus_client's parser."""
    status, headers, body = raw_http(port, raw_request("GET", "/metrics"))
    assert status == 200 and headers["content-type"].startswith("text/plain"), body[:300]
    return parse(body)


def value(families: dict, sample: str, **labels) -> float:
    family = sample.removesuffix("_total")
    return sum(v for name, ls, v in families.get(family, []) if name == sample and labels.items() <= ls.items())


def a_file(home) -> tuple[str, int]:
    p = run_cli("resolve", RELU, "--version", "1", "--target", X86, "--offline", "--json", home=home)
    f = max(json.loads(p.stdout)["files"], key=lambda f: f["size"])
    return f["path"], f["size"]


def test_metrics_count_a_download(home, tmp_path):
    """One serve: a real client's download raises the resolve counters and the bytes sent."""
    path, size = a_file(home)
    with serving(home) as srv:
        before = scrape(srv.port)
        p, got = run_client(DOWNLOAD.format(repo=RELU, path=path), srv.url, tmp_path / "hf")
        assert got == {"size": size}, p.stderr[-2000:]
        # a second HEAD of the same URL is answered by the hot path: it counts as much as the first
        for _ in range(2):
            assert raw_http(srv.port, raw_request("HEAD", f"/kernels/{RELU}/resolve/v1/{path}"))[0] == 200
        raw_http(srv.port, raw_request("GET", "/api/kernels/nobody/nothing"))
        raw_http(srv.port, raw_request("GET", "/" + "x" * 300))  # a path is never a label
        after = scrape(srv.port)
    gets = value(after, "frt_mirror_requests_total", route="resolve", method="GET", status="200")
    assert gets >= value(before, "frt_mirror_requests_total", route="resolve", method="GET", status="200") + 1
    heads = value(after, "frt_mirror_requests_total", route="resolve", method="HEAD", status="200")
    assert heads >= 3  # the client's HEAD, and ours twice
    assert value(after, "frt_mirror_response_bytes_total", route="resolve") >= size
    assert value(after, "frt_mirror_requests_total", route="api_repo", status="404") == 1
    assert value(after, "frt_mirror_requests_total", route="other", status="404") >= 1 + value(
        before, "frt_mirror_requests_total", route="other", status="404"
    )
    assert not any("xxx" in v for fam in after.values() for _n, ls, _v in fam for v in ls.values())
    assert value(before, "frt_mirror_requests_total", route="metrics") == 0  # counted once answered
    assert value(after, "frt_mirror_requests_total", route="metrics", status="200") == 1
    routes = {ls["route"] for _n, ls, _v in after["frt_mirror_requests"]}
    assert routes <= {
        "resolve",
        "api_repo",
        "api_refs",
        "api_tree",
        "api_paths_info",
        "api_commits",
        "api_overview",
        "page",
        "metrics",
        "other",
    }
    # The home, as the ledger and the store say.
    on_disk = [f for f in (home / "store" / "sha256").rglob("*") if f.is_file()]
    assert value(after, "frt_mirror_store_bytes") == sum(f.stat().st_size for f in on_disk)
    assert value(after, "frt_mirror_store_blobs") == len(on_disk)
    assert value(after, "frt_mirror_staged_variants", target=X86) == 2
    assert value(after, "frt_mirror_last_event_files", kind="stage") > 0
    assert abs(value(after, "frt_mirror_last_event_timestamp_seconds", kind="stage") - time.time()) < 3600
    assert "frt_mirror_pull_seconds" in after  # defined, for pull-through to fill


def test_workers_report_together(home):
    """--workers 2: prometheus_client's multiprocess mode. Downloads over a connection one worker holds,
    scrapes over a connection the other holds: the scrape counts them (each is written to its worker's
    file as it is answered), and the count never goes down from one scrape to the next."""
    path, size = a_file(home)
    downloads = 5
    with serving(home, "--workers", "2") as srv:
        conns = two_workers(srv)
        (a, _), (b, _) = conns.items()
        for _ in range(downloads):
            status, _ = get(conns[a], f"/kernels/{RELU}/resolve/v1/{path}")
            assert status == 200
        seen, deadline = [], time.monotonic() + 30
        while time.monotonic() < deadline:
            status, body = get(conns[b], "/metrics")
            seen.append(value(parse(body), "frt_mirror_requests_total", route="resolve", method="GET"))
            if seen[-1] >= downloads:
                break
            time.sleep(0.1)
        last = value(parse(get(conns[a], "/metrics")[1]), "frt_mirror_response_bytes_total", route="resolve")
    assert seen[-1] == downloads, seen
    assert seen == sorted(seen), f"a counter went down between scrapes: {seen}"
    assert last == downloads * size  # the worker that served them, asked in turn, says the same


def test_a_killed_worker_keeps_every_request_it_answered(home):
    """--workers 2: 2000 HEADs over eight keep-alive connections, four accepted by each worker, in turn,
    the last one answered by the victim; SIGKILL to it as soon as its event loop is idle after that
    answer (waiting in epoll_wait: what the worker does after handing a response's bytes to the socket,
    `count` included, runs before it waits again; a kill in those microseconds is no flush's doing).
    Once serve has started another worker in its place, a scrape counts every request that got an
    answer: none of the victim's died with it (a tally flushed once a second lost its last second's:
    a few hundred here, thousands under load)."""
    import http.client
    import os
    import signal

    path, _ = a_file(home)
    url = f"/kernels/{RELU}/resolve/v1/{path}"
    heads, per_conn = 2000, 4
    with serving(home, "--workers", "2") as srv:
        workers = children(srv.proc.pid)
        assert len(workers) == 2, workers
        answered = total(scrape(srv.port)) + 1  # what serving() asked, and this scrape
        conns: dict[int, list] = {w: [] for w in workers}
        for _ in range(200):
            conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
            get(conn, "/api/agent-harnesses")
            answered += 1
            pid = _owner(conn.sock.getsockname()[1], srv.port, workers)
            if len(conns.get(pid, [per_conn])) < per_conn:
                conns[pid].append(conn)
            else:
                conn.close()
            if all(len(c) == per_conn for c in conns.values()):
                break
        assert all(len(c) == per_conn for c in conns.values()), {w: len(c) for w, c in conns.items()}
        survivor, victim = workers
        turn = [c for pair in zip(conns[survivor], conns[victim], strict=False) for c in pair]  # the victim's last
        by_worker = {survivor: 0, victim: 0}
        for i in range(heads):
            conn = turn[i % len(turn)]
            conn.request("HEAD", url)
            r = conn.getresponse()
            r.read()
            assert r.status == 200
            by_worker[victim if conn in conns[victim] else survivor] += 1
        until(lambda: idle(victim), "the victim to wait for its next request")
        os.kill(victim, signal.SIGKILL)
        answered += heads
        for conn in turn:
            conn.close()
        # serve restarts it: two workers again, the victim not among them (the scrape waits for that)
        until(lambda: (w := children(srv.proc.pid)) and len(w) == 2 and victim not in w, "a new worker")
        until(lambda: idle(survivor), "the survivor to be idle")
        after = scrape(srv.port)
    assert by_worker == {survivor: heads // 2, victim: heads // 2}
    got = value(after, "frt_mirror_requests_total", route="resolve", method="HEAD", status="200")
    assert got == heads, f"{heads - got:g} of the {heads} HEADs answered were not counted"
    assert total(after) == answered, (total(after), answered)


def total(families: dict) -> float:
    """Every request answered, by any route, method and status."""
    return sum(v for name, _ls, v in families.get("frt_mirror_requests", []) if name == "frt_mirror_requests_total")


def until(cond, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.0002)


def idle(pid: int) -> bool:
    """Whether `pid`'s main thread (a worker's event loop) sleeps in epoll_wait: nothing left to run."""
    from pathlib import Path

    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state == "S" and "epoll" in Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return False


def parse(body: bytes) -> dict[str, list]:
    from prometheus_client.parser import text_string_to_metric_families

    return {
        f.name: [(s.name, s.labels, s.value) for s in f.samples] for f in text_string_to_metric_families(body.decode())
    }


def get(conn, path: str) -> tuple[int, bytes]:
    conn.request("GET", path)
    r = conn.getresponse()
    return r.status, r.read()


def two_workers(srv) -> dict:
    """{worker pid: a keep-alive connection that worker accepted}, for two workers. Which worker accepts a
    connection is the kernel's choice: open connections until both have one (each found by its socket)."""
    import http.client
    from pathlib import Path

    workers = [int(c) for c in Path(f"/proc/{srv.proc.pid}/task/{srv.proc.pid}/children").read_text().split()]
    assert len(workers) == 2, workers
    conns: dict = {}
    for _ in range(60):
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        get(conn, "/api/agent-harnesses")  # accepted and answered: the server's end of it exists now
        pid = _owner(conn.sock.getsockname()[1], srv.port, workers)
        if pid in conns:
            conn.close()
        else:
            conns[pid] = conn
        if len(conns) == 2:
            return conns
    pytest.fail(f"60 connections, all accepted by worker {list(conns)}")


def _owner(client_port: int, server_port: int, pids: list[int]) -> int | None:
    """The pid whose socket is the server's end of the connection from `client_port` (/proc/net/tcp)."""
    import os

    inode = None
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        f = line.split()
        if f[1].endswith(f":{server_port:04X}") and f[2].endswith(f":{client_port:04X}"):
            inode = f[9]
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]":
                    return pid
            except OSError:
                continue
    return None


def test_route_names_are_a_fixed_set():
    from frt.mirror.serve.metrics import ROUTES, route_name

    cases = {
        b"/": "page",
        b"/-/repos/a/b": "page",
        b"/metrics": "metrics",
        b"/metrics/x": "other",
        b"/api/kernels/a/b": "api_repo",
        b"/api/models/a/b/revision/main": "api_repo",
        b"/api/kernels/a/b/refs": "api_refs",
        b"/api/kernels/a/b/tree/v1/build": "api_tree",
        b"/api/models/a/b/paths-info/main": "api_paths_info",
        b"/api/kernels/a/b/commits/v1": "api_commits",
        b"/api/organizations/a/overview": "api_overview",
        b"/a/b/resolve/main/x": "resolve",
        b"/kernels/a/b/resolve/release%2Fv1/build/x.py?download=1": "resolve",
        b"/api/agent-harnesses": "other",
        b"/\xff/%zz": "other",
        b"/api": "other",
    }
    for raw, route in cases.items():
        assert route_name(raw) == route, raw
        assert route in ROUTES


def test_observe_pull_is_for_the_pull_through_code():
    """What pull-through calls: counted and timed in a serving process; label values stay a small set."""
    from prometheus_client.parser import text_string_to_metric_families

    from frt.mirror.serve import metrics

    m = metrics.Metrics()
    metrics.observe_pull("file", 0.3, 4096, "ok")
    metrics.observe_pull("file", 2.0, 0, "unavailable")
    metrics.observe_pull("kernels-test/activation", 0.1, 10, "ok")  # a caller's slip: not a new series per repo
    m.count("resolve", "HEAD", 200, 0)
    m.flush()
    fams = {f.name: f.samples for f in text_string_to_metric_families(m.exposition().decode())}
    pulls = {
        (s.labels["kind"], s.labels["outcome"]): s.value
        for s in fams["frt_mirror_pull_seconds"]
        if s.name == "frt_mirror_pull_seconds_count"
    }
    assert pulls == {("file", "ok"): 1, ("file", "unavailable"): 1, ("other", "ok"): 1}
    assert {
        s.labels["kind"]: s.value for s in fams["frt_mirror_pull_bytes"] if s.name == "frt_mirror_pull_bytes_total"
    } == {"file": 4096, "other": 10}
    assert not any(name.startswith(("frt_mirror_resolve", "frt_mirror_stage_")) for name in fams)  # never filled
    assert [s.value for s in fams["frt_mirror_requests"] if s.name.endswith("_total")] == [1]


def test_with_tokens_the_page_and_metrics_need_one(home, tmp_path):
    """Tokens guard every route: the page and /metrics say as much about the mirror as the API does."""
    import shutil

    copy = tmp_path / "home"
    shutil.copytree(home, copy)
    token = run_cli("token", "add", "prometheus", home=copy).stdout.strip()
    with serving(copy) as srv:
        for path in ("/", "/metrics", f"/-/repos/{RELU}"):
            assert raw_http(srv.port, raw_request("GET", path))[0] == 401, path
            assert raw_http(srv.port, raw_request("GET", path, f"Authorization: Bearer {token}"))[0] == 200, path


def test_an_org_named_metrics_is_still_a_hub_repo(home):
    """`/metrics` and `/-/…` are the operator's; `/metrics/x/resolve/main/f` is org "metrics"'s model repo
    (the first version routed every path starting with "metrics" to the page: a 404 page, no X-Error-Code)."""
    with serving(home) as srv:
        status, headers, _ = raw_http(srv.port, raw_request("GET", "/metrics/tiny/resolve/main/config.json"))
        assert (status, headers.get("x-error-code")) == (404, "RepoNotFound"), headers
        status, headers, _ = raw_http(srv.port, raw_request("GET", "/api/models/metrics/tiny"))
        assert (status, headers.get("x-error-code")) == (404, "RepoNotFound"), headers


# -- a worker killed right after an answer's last byte ----------------------------------------
# `/metrics` loses no answered request when its worker is killed right after the answer's last byte left.
#
# A worker's counts outlive it (prometheus_client's multiprocess files: test_metrics.py), so what is left
# to lose is the order: an answer counted after its last bytes were handed to the server is lost by a
# kill between the two. That window is microseconds wide, too narrow to hit from outside, so the kill is
# put there: serve runs with a `sitecustomize` (on PYTHONPATH, for this test's serve only) that wraps the
# two places an answer's last bytes leave a worker (the ASGI `send` MirrorApp is given, and the
# protocol's sendfile) and SIGKILLs the worker as soon as they have gone, where a marker file says to.
# Everything else is serve as it runs. Each answer path is tried: the app's (a JSON route, and a file
# hashed as it is sent), the hot table's (a request through a proxy, which the protocol leaves to the
# app) and the protocol's own sendfile; each time the client gets its whole answer, serve starts another
# worker, and a scrape counts every answer the clients got.

INJECT = """
import os, signal

MARKER = os.environ.get("KILL_AFTER_LAST_BYTE")


def _kill_if_marked():
    try:
        os.unlink(MARKER)  # once: the next answer is the one to kill after
    except FileNotFoundError:
        return
    os.kill(os.getpid(), signal.SIGKILL)


if MARKER:
    from frt.mirror.serve import app, sendfile

    _call, _send = app.MirrorApp.__call__, sendfile.send

    async def __call__(self, scope, receive, send):
        async def sent_then_killed(message):
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                _kill_if_marked()

        await _call(self, scope, receive, sent_then_killed if scope["type"] == "http" else send)

    async def sendfile_then_killed(*args):
        n = await _send(*args)
        _kill_if_marked()
        return n

    app.MirrorApp.__call__, sendfile.send = __call__, sendfile_then_killed
"""


@pytest.mark.parametrize(
    "kind",
    ["json route", "a file hashed as it is sent", "hot table, through a proxy", "sendfile"],
)
def test_a_worker_killed_right_after_the_last_byte_has_counted_it(home, tmp_path, kind):
    path, size = a_file(home)
    url = f"/kernels/{RELU}/resolve/v1/{path}"
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent(INJECT))
    marker = tmp_path / "kill-next"
    env = replica_env(PYTHONPATH=str(site), KILL_AFTER_LAST_BYTE=str(marker))
    with serving(home, "--workers", "2", env=env) as srv:
        victim, conn = next(iter(two_workers(srv).items()))  # a keep-alive connection the victim accepted
        before = total(scrape(srv.port))  # every request so far, not this scrape: it is counted as it goes
        asked = 1
        if kind != "a file hashed as it is sent":  # its first GET hashes it; then it is one verified lately
            for _ in range(3):
                assert get(conn, url)[0] == 200
                asked += 1
        # the request whose worker dies as its last byte leaves, once the victim has done with the last
        until(lambda: idle(victim), "the victim to wait for its next request")
        marker.touch()
        # Through a proxy, the protocol leaves a GET to the app, whose hot table answers it.
        proxied = {"X-Forwarded-For": "10.0.0.7"} if kind == "hot table, through a proxy" else {}
        conn.request("GET", f"/api/kernels/{RELU}/refs" if kind == "json route" else url, headers=proxied)
        r = conn.getresponse()
        status, body = r.status, r.read()
        asked += 1
        assert status == 200 and (kind == "json route" or len(body) == size), (status, len(body))
        until(lambda: not marker.exists() and victim not in children(srv.proc.pid), "the victim to be killed")
        until(lambda: len(children(srv.proc.pid)) == 2, "serve to start another worker")
        counted = total(scrape(srv.port))
    assert counted == before + asked, f"{before + asked - counted:g} answered request(s) not counted ({kind})"
