"""FakeHub: a stdlib HTTP server that answers like the real Hugging Face Hub.

Shapes, headers and error codes follow what the real Hub sends and what huggingface_hub / kernels
read (see /work/shared/research/hub-protocol.md, sections 1 and 5). It is deliberately not a copy
of our own mirror server, so that tests against it judge the mirror instead of echoing it.
"""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
import traceback
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, parse_qsl, unquote, urlencode, urlsplit

from .faults import Faults
from .repo import Commit, FakeRepo, git_blob_oid

REPO_TYPES = {"models": "model", "kernels": "kernel", "datasets": "dataset", "spaces": "space"}
RESOLVE_PREFIXES = {"kernels": "kernel", "datasets": "dataset", "spaces": "space"}  # models: none
CHUNK = 1 << 20


def iso(dt: datetime) -> str:
    """The Hub's timestamp format: 2026-01-01T00:00:00.000Z."""
    dt = dt.astimezone(timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The git-lfs pointer file that git actually stores for a large file."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


class HubError(Exception):
    """An error answer; `code` becomes X-Error-Code (None: a bare status, as for injected faults)."""

    def __init__(self, status: int, code: str | None, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}


class FakeHub:
    def __init__(
        self,
        repos: list[FakeRepo] | tuple = (),
        *,
        trusted_orgs=(),
        page_size: int = 5,
        lfs_threshold: int = 64 * 1024,
    ):
        self.repos: dict[tuple[str, str], FakeRepo] = {}
        for r in repos:
            self.add_repo(r)
        self.trusted_orgs = set(trusted_orgs)
        self.page_size = page_size
        self.lfs_threshold = lfs_threshold
        self.faults = Faults()
        self._log_lock = threading.Lock()
        self._requests: list[tuple[str, str, int]] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._conns: set[socket.socket] = set()  # open client connections, severed by stop()
        self._bodies = 0  # file bodies being streamed right now

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        server = ThreadingHTTPServer((host, port), _Handler)
        server.daemon_threads = True
        server.hub = self  # type: ignore[attr-defined]
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="fakehub", daemon=True
        )
        self._thread.start()
        return self.url

    def stop(self) -> None:
        """Die as a host dies: stop accepting *and* sever every open connection.

        `shutdown()` + `server_close()` alone only close the listening socket; the handler threads
        would go on serving their keep-alive connections, so a client that had opened its downloads
        would finish them against an upstream that is supposedly gone.
        """
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
            self._server = self._thread = None
        with self._log_lock:
            conns, self._conns = list(self._conns), set()
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)  # the handler thread's next read/write fails
            except OSError:
                pass

    def __enter__(self) -> FakeHub:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("FakeHub is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def add_repo(self, repo: FakeRepo) -> FakeRepo:
        self.repos[(repo.repo_type, repo.repo_id)] = repo
        return repo

    # -- request log ---------------------------------------------------------------------------

    @property
    def requests(self) -> list[tuple[str, str, int]]:
        """(method, raw path with query, status) of every answered request, oldest first (a copy)."""
        with self._log_lock:
            return list(self._requests)

    def reset_log(self) -> None:
        with self._log_lock:
            self._requests.clear()

    def _log(self, method: str, path: str, status: int) -> None:
        with self._log_lock:
            self._requests.append((method, path, status))

    @property
    def bodies_in_flight(self) -> int:
        """File bodies (resolve GETs) being streamed at this moment: evidence that a client is
        mid-download, for a test that must kill the upstream then and not before."""
        with self._log_lock:
            return self._bodies

    def wait_for_body(self, n: int = 1, timeout: float = 60.0) -> bool:
        """Wait until at least `n` bodies are in flight at once; False after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while self.bodies_in_flight < n:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def _track(self, conn: socket.socket, open_: bool) -> None:
        with self._log_lock:
            (self._conns.add if open_ else self._conns.discard)(conn)

    def _body(self, delta: int) -> None:
        with self._log_lock:
            self._bodies += delta


class _Handler(BaseHTTPRequestHandler):
    # Headers and body go out in separate writes; without TCP_NODELAY every keep-alive
    # request stalls ~40 ms on the client's delayed ACK.
    disable_nagle_algorithm = True
    protocol_version = "HTTP/1.1"  # keep-alive; so every answer carries Content-Length
    server_version = "FakeHub/1.0"
    timeout = 60  # idle keep-alive connections give their thread back eventually

    # -- plumbing ------------------------------------------------------------------------------

    @property
    def hub(self) -> FakeHub:
        return self.server.hub  # type: ignore[attr-defined]

    def setup(self):
        super().setup()
        self.hub._track(self.connection, True)

    def finish(self):
        self.hub._track(self.connection, False)
        try:
            super().finish()
        except OSError:  # a connection severed by stop(): nothing left to flush
            pass

    def handle(self):
        try:
            super().handle()
        except OSError:  # severed by stop() between requests
            self.close_connection = True

    def log_message(self, format, *args):  # silence stderr
        pass

    def log_request(self, code="-", size="-"):  # called by send_response: one log entry per answer
        self.hub._log(self.command or "-", getattr(self, "path", "-"), int(code))

    def do_GET(self):
        self._handle()

    def do_HEAD(self):
        self._handle()

    def do_POST(self):
        self._handle()

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.body = self.rfile.read(length) if length else b""  # drain it, or keep-alive desyncs
        self._sent_headers = False
        parts = urlsplit(self.path)
        self.query = dict(parse_qsl(parts.query, keep_blank_values=True))
        # Split the *raw* path first, then decode each segment: "release%2Fv1" stays one segment.
        self.segs = [unquote(s) for s in parts.path.split("/")[1:]]
        try:
            if (pause := self.hub.faults.delay_for(self.path)) > 0:
                time.sleep(pause)
            if (status := self.hub.faults.take_failure(self.path)) is not None:
                raise HubError(status, None, f"injected fault {status}")
            self._route()
        except HubError as e:
            self._send_error(e)
        except OSError:  # the client went away, or stop() severed the connection
            self.close_connection = True
        except Exception as e:  # a bug in the fake: answer 500 loudly rather than hang the client
            traceback.print_exc()
            if self._sent_headers:
                self.close_connection = True
            else:
                self._send_error(HubError(500, None, f"fakehub bug: {e!r}"))

    def _send(self, status: int, body: bytes, headers: dict, content_type: str | None = None) -> None:
        self.send_response(status)
        if content_type:
            self.send_header("Content-Type", content_type)
        for k, v in headers.items():
            self.send_header(k, str(v))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self._sent_headers = True
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_json(self, obj, headers: dict | None = None, status: int = 200) -> None:
        self._send(status, json.dumps(obj).encode(), headers or {}, "application/json; charset=utf-8")

    def _send_error(self, e: HubError) -> None:
        headers = dict(e.headers)
        if e.code:
            headers["X-Error-Code"] = e.code
            headers["X-Error-Message"] = e.message
        self._send_json({"error": e.message}, headers, e.status)

    def _not_found(self) -> None:
        self._send(404, b"Not Found", {}, "text/plain; charset=utf-8")

    # -- routing -------------------------------------------------------------------------------

    def _route(self) -> None:
        s, m = self.segs, self.command
        if s[:1] == ["api"] and len(s) >= 4 and s[1] in REPO_TYPES:
            return self._api_repo(REPO_TYPES[s[1]], f"{s[2]}/{s[3]}", s[4:])
        if s[:2] == ["api", "organizations"] and len(s) == 4 and s[3] == "overview" and m == "GET":
            org = s[2]
            return self._send_json(
                {"name": org, "fullname": org, "trustedKernelPublisher": org in self.hub.trusted_orgs}
            )
        # /{prefix}{org}/{name}/resolve/{rev}/{path}; "kernels/x/resolve/..." is a *model* "kernels/x".
        if len(s) >= 6 and s[0] in RESOLVE_PREFIXES and s[3] == "resolve":
            return self._resolve(RESOLVE_PREFIXES[s[0]], f"{s[1]}/{s[2]}", s[4], "/".join(s[5:]))
        if len(s) >= 5 and s[2] == "resolve":
            return self._resolve("model", f"{s[0]}/{s[1]}", s[3], "/".join(s[4:]))
        return self._not_found()  # includes /api/agent-harnesses, as a Hub that lacks it

    def _api_repo(self, repo_type: str, repo_id: str, rest: list[str]) -> None:
        repo = self._repo(repo_type, repo_id)
        get = self.command in ("GET", "HEAD")
        if not rest:
            return self._info(repo, "main") if get else self._not_found()
        if rest[0] == "revision" and len(rest) >= 2 and get:
            return self._info(repo, "/".join(rest[1:]))  # tolerate an unencoded slash revision
        if rest == ["refs"] and get:
            return self._refs(repo)
        if rest[0] == "tree" and len(rest) >= 2 and get:
            return self._tree(repo, rest[1], "/".join(rest[2:]))
        if rest[0] == "paths-info" and len(rest) == 2 and self.command == "POST":
            return self._paths_info(repo, rest[1])
        if rest[0] == "commits" and len(rest) <= 2 and get:
            return self._commits(repo, rest[1] if len(rest) == 2 else "main")
        return self._not_found()

    def _repo(self, repo_type: str, repo_id: str) -> FakeRepo:
        repo = self.hub.repos.get((repo_type, repo_id))
        if repo is None:
            # The Hub answers 401 for missing and private repos alike.
            raise HubError(401, "RepoNotFound", f"Repository not found: {repo_type} {repo_id}")
        return repo

    def _commit(self, repo: FakeRepo, rev: str) -> Commit:
        sha = repo.resolve_ref(rev)
        if sha is None:
            raise HubError(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        return repo.commits[sha]

    # -- API routes ----------------------------------------------------------------------------

    def _info(self, repo: FakeRepo, rev: str) -> None:
        c = self._commit(repo, rev)
        self._send_json({
            "id": repo.repo_id, "sha": c.sha, "private": False, "lastModified": iso(c.date),
            "author": repo.author, "siblings": [{"rfilename": p} for p in sorted(c.files)],
        })

    def _refs(self, repo: FakeRepo) -> None:
        def refs(d, kind):
            return [{"name": n, "ref": f"refs/{kind}/{n}", "targetCommit": s} for n, s in sorted(d.items())]

        body = {"branches": refs(repo.branches, "heads"), "tags": refs(repo.tags, "tags"), "converts": []}
        if self.query.get("include_prs") in ("1", "true", "True"):
            body["pullRequests"] = []
        self._send_json(body)

    def _tree(self, repo: FakeRepo, rev: str, path: str) -> None:
        c = self._commit(repo, rev)
        path = path.strip("/")
        dirs = c.dirs()
        if path and path not in dirs:
            raise HubError(404, "EntryNotFound", f"{path} does not exist on \"{rev}\"")
        recursive = self.query.get("recursive", "false").lower() in ("1", "true")
        expand = self.query.get("expand", "false").lower() in ("1", "true")
        prefix = path + "/" if path else ""
        below = [p for p in sorted(set(c.files) | dirs) if p.startswith(prefix)]
        if not recursive:
            below = [p for p in below if "/" not in p[len(prefix):]]
        self._paginate([self._entry(repo, c, p, expand) for p in below])

    def _paths_info(self, repo: FakeRepo, rev: str) -> None:
        c = self._commit(repo, rev)
        if self.headers.get("Content-Type", "").startswith("application/json"):
            form = json.loads(self.body or b"{}")
            paths, expand = form.get("paths", []), bool(form.get("expand"))
        else:
            form = parse_qs(self.body.decode(), keep_blank_values=True)
            paths, expand = form.get("paths", []), form.get("expand", ["false"])[-1].lower() == "true"
        dirs = c.dirs()
        found = [p.strip("/") for p in paths if p.strip("/") in c.meta or p.strip("/") in dirs]
        self._send_json([self._entry(repo, c, p, expand) for p in dict.fromkeys(found)])

    def _commits(self, repo: FakeRepo, rev: str) -> None:
        c = self._commit(repo, rev)
        self._paginate([
            {"id": h.sha, "title": h.title, "message": h.message, "date": iso(h.date),
             "authors": [{"user": a} for a in h.authors]}
            for h in repo.history(c.sha)
        ])

    def _entry(self, repo: FakeRepo, c: Commit, path: str, expand: bool) -> dict:
        if path in c.meta:
            m = c.meta[path]
            entry = {"type": "file", "oid": m.oid, "size": m.size, "path": path}
            if m.size >= self.hub.lfs_threshold:
                # As on the Hub: git stores a pointer file, so `oid` is the *pointer's* blob id and
                # the content hash lives in lfs.oid. Never a `xetHash`.
                pointer = lfs_pointer(m.sha256, m.size)
                entry["oid"] = git_blob_oid(pointer)
                entry["lfs"] = {"oid": m.sha256, "size": m.size, "pointerSize": len(pointer)}
        else:
            entry = {"type": "directory", "oid": c.dir_oid(path), "path": path}
        if expand:
            last = _last_touch(repo, c, path)
            entry["lastCommit"] = {"id": last.sha, "title": last.title, "date": iso(last.date)}
        return entry

    def _paginate(self, items: list) -> None:
        """Serve one page; a `Link: <absolute next url>; rel="next"` header when more remain."""
        try:
            start = int(base64.urlsafe_b64decode(self.query.get("cursor", "") + "==").decode() or 0)
        except ValueError:
            raise HubError(400, None, "invalid cursor") from None
        end = start + self.hub.page_size
        headers = {}
        if end < len(items):
            params = [(k, v) for k, v in parse_qsl(urlsplit(self.path).query, keep_blank_values=True)
                      if k != "cursor"]
            params.append(("cursor", base64.urlsafe_b64encode(str(end).encode()).decode().rstrip("=")))
            host = self.headers.get("Host") or "%s:%s" % self.server.server_address[:2]
            headers["Link"] = f'<http://{host}{urlsplit(self.path).path}?{urlencode(params)}>; rel="next"'
        self._send_json(items[start:end], headers)

    # -- file downloads ------------------------------------------------------------------------

    def _resolve(self, repo_type: str, repo_id: str, rev: str, path: str) -> None:
        if self.command not in ("GET", "HEAD"):
            return self._not_found()
        repo = self._repo(repo_type, repo_id)
        c = self._commit(repo, rev)
        if path not in c.meta:
            raise HubError(404, "EntryNotFound", f"{path} does not exist on \"{rev}\"",
                           {"X-Repo-Commit": c.sha})  # lets the client record .no_exist/<sha>/<path>
        meta, data = c.meta[path], c.files[path]
        headers = {"X-Repo-Commit": c.sha, "Accept-Ranges": "bytes"}
        if meta.size >= self.hub.lfs_threshold:
            headers.update({"ETag": f'"{meta.sha256}"', "X-Linked-Etag": f'"{meta.sha256}"',
                            "X-Linked-Size": meta.size})
        else:
            headers["ETag"] = f'"{meta.oid}"'
        status, start, end = 200, 0, len(data)  # served bytes: may differ from meta after tampering
        rng = _parse_range(self.headers.get("Range"), len(data))
        if rng == "unsatisfiable":
            raise HubError(416, None, "Requested Range Not Satisfiable",
                           {"Content-Range": f"bytes */{len(data)}", "X-Repo-Commit": c.sha})
        if rng is not None:
            status, (start, end) = 206, rng
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(data)}"
        drop = self.hub.faults.take_drop(self.path) if self.command == "GET" else None

        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        for k, v in headers.items():
            self.send_header(k, str(v))
        self.send_header("Content-Length", str(end - start))
        self.end_headers()
        self._sent_headers = True
        if self.command == "HEAD":
            return
        view = memoryview(data)[start:end]
        if drop is not None:
            view = view[:drop]
        rate = self.hub.faults.rate_for(self.path)
        step = CHUNK if rate is None else max(1, min(CHUNK, int(rate / 20)))
        self.hub._body(+1)
        try:
            for off in range(0, len(view), step):  # stream: no per-request copy of a large body
                self.wfile.write(view[off:off + step])
                if rate is not None:
                    time.sleep(step / rate)
        finally:
            self.hub._body(-1)
        if drop is not None:
            # Short body then EOF: the client sees fewer bytes than Content-Length promised.
            self.wfile.flush()
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.close_connection = True


def _parse_range(header: str | None, size: int):
    """A single `bytes=s-e` / `bytes=s-` / `bytes=-n` range -> (start, end_exclusive).

    None: no usable Range (serve 200, as servers ignore syntax they do not understand);
    "unsatisfiable": answer 416.
    """
    if not header or not header.startswith("bytes=") or "," in header:
        return None
    first, _, last = header[6:].strip().partition("-")
    try:
        if first == "":  # suffix: the last n bytes
            n = int(last)
            return (max(size - n, 0), size) if n > 0 and size > 0 else "unsatisfiable"
        start = int(first)
        end = int(last) + 1 if last else size
    except ValueError:
        return None
    if start >= size or end <= start:
        return "unsatisfiable"
    return start, min(end, size)


def _last_touch(repo: FakeRepo, c: Commit, path: str) -> Commit:
    """The newest commit in c's history that changed `path` (file oid or directory contents)."""
    def key(commit: Commit):
        return commit.meta[path].oid if path in commit.meta else commit.dir_oid(path)

    history = repo.history(c.sha)
    for newer, older in zip(history, history[1:]):
        if key(newer) != key(older):
            return newer
    return history[-1]
