"""`/metrics` loses no answered request when its worker is killed right after the answer's last byte left.

A worker's counts outlive it (prometheus_client's multiprocess files: test_metrics.py), so what is left
to lose is the order: an answer counted after its last bytes were handed to the server is lost by a
kill between the two. That window is microseconds wide, too narrow to hit from outside, so the kill is
put there: serve runs with a `sitecustomize` (on PYTHONPATH, for this test's serve only) that wraps the
two places an answer's last bytes leave a worker (the ASGI `send` MirrorApp is given, and the
protocol's sendfile) and SIGKILLs the worker as soon as they have gone, where a marker file says to.
Everything else is serve as it runs. Each answer path is tried: the app's (a JSON route, and a file
hashed as it is sent), the hot table's (a request through a proxy, which the protocol leaves to the
app) and the protocol's own sendfile; each time the client gets its whole answer, serve starts another
worker, and a scrape counts every answer the clients got."""

from __future__ import annotations

import textwrap

import pytest

from tests.support.serve_helpers import children, replica_env, serving
from tests.test_metrics import RELU, a_file, get, home, idle, scrape, total, two_workers, until  # noqa: F401  (home)

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
def test_a_worker_killed_right_after_the_last_byte_has_counted_it(home, tmp_path, kind):  # noqa: F811
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
