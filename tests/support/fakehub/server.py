"""FakeHub: a stdlib HTTP server that answers like the real Hugging Face Hub.

Shapes, headers and error codes follow what the real Hub sends and what huggingface_hub / kernels
read (see /work/shared/research/hub-protocol.md, sections 1 and 5). It is deliberately not a copy
of our own mirror server, so that tests against it judge the mirror instead of echoing it.

By default it serves every file straight from `/resolve` (200/206) and never limits anyone: the
simple form of the protocol. The real Hub's transport is there behind switches, each off by default
(see DESIGN.md, "The real Hub's transport"):
- `redirects=True`: small files 307 to the same host's `/api/resolve-cache/…`, LFS files 302 to a
  CDN on a second host with expiring signed URLs (`cdn.py`, `cdn_url_ttl`);
- `rate_limits=RateLimits(...)`: fixed-window quotas per bucket, 429 over quota (`ratelimit.py`);
- `FakeRepo.force_push(..., stale_for=N)`: `/revision/<branch>` names the removed old head for the
  next N info answers while `/refs` already shows the new one.
"""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from datetime import UTC, datetime
from http.server import ThreadingHTTPServer
from urllib.parse import parse_qs, parse_qsl, quote, urlencode, urlsplit

from .cdn import UrlSigner, make_cdn_server
from .faults import Faults
from .ratelimit import RateLimiter, RateLimits
from .repo import Commit, FakeRepo, FileMeta, git_blob_oid
from .wire import BaseHandler, HubError, LoggedRequest

REPO_TYPES = {"models": "model", "kernels": "kernel", "datasets": "dataset", "spaces": "space"}
RESOLVE_PREFIXES = {"kernels": "kernel", "datasets": "dataset", "spaces": "space"}  # models: none


def iso(dt: datetime) -> str:
    """The Hub's timestamp format: 2026-01-01T00:00:00.000Z."""
    dt = dt.astimezone(UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The git-lfs pointer file that git actually stores for a large file."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


class FakeHub:
    """The Hub on 127.0.0.1 (and, with redirects, its CDN on `cdn_host`).

    Switches (constructor keywords, and attributes a test may change while the hub runs):
    - `redirects`: answer `/resolve` with the real Hub's 307 (small files) / 302 (LFS, to the CDN).
    - `cdn_url_ttl`: seconds a CDN URL stays valid (the Hub's is about an hour); then 403.
    - `rate_limits`: a `RateLimits` to enforce, or None; assigning one starts fresh windows.
      Injected faults (`faults.fail_next`) answer before the limiter counts, as a proxy in front would.
    Faults also apply on the CDN: its URLs carry the file name (in `response-content-disposition`), so
    `faults.drop_after("weights.bin", n)` cuts the CDN body when redirects are on.
    """

    def __init__(
        self,
        repos: list[FakeRepo] | tuple = (),
        *,
        trusted_orgs=(),
        page_size: int = 5,
        lfs_threshold: int = 64 * 1024,
        redirects: bool = False,
        cdn_host: str = "127.0.0.2",
        cdn_url_ttl: float = 3600.0,
        rate_limits: RateLimits | None = None,
    ):
        self.repos: dict[tuple[str, str], FakeRepo] = {}
        for r in repos:
            self.add_repo(r)
        self.trusted_orgs = set(trusted_orgs)
        self.page_size = page_size
        self.lfs_threshold = lfs_threshold
        self.redirects = redirects
        self.cdn_host = cdn_host
        self.cdn_url_ttl = cdn_url_ttl
        self.rate_limits = rate_limits
        self.faults = Faults()
        self._log_lock = threading.Lock()
        self._requests: list[LoggedRequest] = []
        self._server: ThreadingHTTPServer | None = None
        self._cdn: ThreadingHTTPServer | None = None
        self._threads: list[threading.Thread] = []
        self._start_lock = threading.Lock()
        self._conns: set[socket.socket] = set()  # open client connections (both hosts), severed by stop()
        self._bodies = 0  # file bodies being streamed right now
        self._body_bytes = 0
        self._signer = UrlSigner()
        self._cdn_objects: dict[str, tuple[Commit, str]] = {}  # sha256 -> where its served bytes live

    @property
    def rate_limits(self) -> RateLimits | None:
        return self._limiter.limits if self._limiter else None

    @rate_limits.setter
    def rate_limits(self, limits: RateLimits | None) -> None:
        self._limiter = RateLimiter(limits) if limits else None

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        server = ThreadingHTTPServer((host, port), _Handler)
        server.daemon_threads = True
        server.hub = self  # type: ignore[attr-defined]
        with self._start_lock:
            self._server = server
        self._serve(server, "fakehub")
        if self.redirects:
            self._ensure_cdn()
        return self.url

    def _serve(self, server: ThreadingHTTPServer, name: str) -> None:
        t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def _ensure_cdn(self) -> ThreadingHTTPServer:
        """The CDN host, started on first need (redirects may be switched on while running)."""
        with self._start_lock:
            if self._server is None:  # never (re)start a CDN for a hub that is stopped
                raise RuntimeError("FakeHub is not started")
            if self._cdn is None:
                self._cdn = make_cdn_server(self, self.cdn_host)
                self._serve(self._cdn, "fakehub-cdn")
            return self._cdn

    def stop(self) -> None:
        """Die as a host dies: stop accepting *and* sever every open connection, on both hosts.

        `shutdown()` + `server_close()` alone only close the listening socket; the handler threads
        would go on serving their keep-alive connections, so a client that had opened its downloads
        would finish them against an upstream that is supposedly gone.
        """
        self.faults.release()  # a held body must not keep its handler thread waiting
        with self._start_lock:
            servers, self._server, self._cdn = [self._server, self._cdn], None, None
            threads, self._threads = self._threads, []
        for server in servers:
            if server is not None:
                server.shutdown()
                server.server_close()
        for t in threads:
            t.join(timeout=5)
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

    @property
    def cdn_url(self) -> str:
        host, port = self._ensure_cdn().server_address[:2]
        return f"http://{host}:{port}"

    def add_repo(self, repo: FakeRepo) -> FakeRepo:
        self.repos[(repo.repo_type, repo.repo_id)] = repo
        return repo

    def _cdn_location(self, c: Commit, path: str, meta: FileMeta) -> str:
        """A fresh signed CDN URL for an LFS file (its served bytes, looked up by sha256)."""
        self._cdn_objects[meta.sha256] = (c, path)
        name = path.rsplit("/", 1)[-1]
        # As cdn-lfs URLs do: the file name rides in the query (so fault rules matching it apply here).
        disposition = f"inline; filename*=UTF-8''{quote(name)}; filename=\"{name}\";"
        signed = self._signer.sign(
            f"/cdn/{meta.sha256}", {"response-content-disposition": disposition}, self.cdn_url_ttl
        )
        return self.cdn_url + signed

    # -- request log ---------------------------------------------------------------------------

    @property
    def requests(self) -> list[tuple[str, str, int]]:
        """(method, raw path with query, status) of every answered request, oldest first (a copy),
        CDN requests included (their paths start with /cdn/)."""
        with self._log_lock:
            return [r[:3] for r in self._requests]

    @property
    def request_log(self) -> list[LoggedRequest]:
        """Like `requests`, with the answering server ("hub"/"cdn") and the request's headers."""
        with self._log_lock:
            return list(self._requests)

    def reset_log(self) -> None:
        with self._log_lock:
            self._requests.clear()

    def _log(self, entry: LoggedRequest) -> None:
        with self._log_lock:
            self._requests.append(entry)

    @property
    def bodies_in_flight(self) -> int:
        """File bodies (resolve, resolve-cache and CDN GETs) being streamed at this moment: evidence
        that a client is mid-download, for a test that must kill the upstream then and not before."""
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

    @property
    def body_bytes(self) -> int:
        """File body bytes written to clients so far, on both hosts (what a link to the Hub would carry)."""
        with self._log_lock:
            return self._body_bytes

    def _sent(self, n: int) -> None:
        with self._log_lock:
            self._body_bytes += n


class _Handler(BaseHandler):
    def _not_found(self) -> None:
        self._send(404, b"Not Found", {}, "text/plain; charset=utf-8")

    # -- routing -------------------------------------------------------------------------------

    def _route(self) -> None:
        s, m = self.segs, self.command
        resolve = None  # (repo type, repo id, rev, path) of a /resolve URL
        # /{prefix}{org}/{name}/resolve/{rev}/{path}; "kernels/x/resolve/..." is a *model* "kernels/x".
        if len(s) >= 6 and s[0] in RESOLVE_PREFIXES and s[3] == "resolve":
            resolve = (RESOLVE_PREFIXES[s[0]], f"{s[1]}/{s[2]}", s[4], "/".join(s[5:]))
        elif len(s) >= 5 and s[2] == "resolve":
            resolve = ("model", f"{s[0]}/{s[1]}", s[3], "/".join(s[4:]))
        cache = s[:2] == ["api", "resolve-cache"]
        if self.hub._limiter is not None:
            bucket = "resolvers" if resolve or cache else "api" if s[:1] == ["api"] else None
            if bucket:
                self.extra_headers = self.hub._limiter.take(bucket)  # or raises the 429
        if resolve:
            return self._resolve(*resolve)
        if cache:
            return self._resolve_cache(s[2:])
        if s[:1] == ["api"] and len(s) >= 4 and s[1] in REPO_TYPES:
            return self._api_repo(REPO_TYPES[s[1]], f"{s[2]}/{s[3]}", s[4:])
        if s[:2] == ["api", "organizations"] and len(s) == 4 and s[3] == "overview" and m == "GET":
            org = s[2]
            return self._send_json(
                {"name": org, "fullname": org, "trustedKernelPublisher": org in self.hub.trusted_orgs}
            )
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
        c = repo.take_stale(rev) or self._commit(repo, rev)  # a stale answer after a force-push
        self._send_json(
            {
                "id": repo.repo_id,
                "sha": c.sha,
                "private": False,
                "lastModified": iso(c.date),
                "author": repo.author,
                "siblings": [{"rfilename": p} for p in sorted(c.files)],
            }
        )

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
            raise HubError(404, "EntryNotFound", f'{path} does not exist on "{rev}"')
        recursive = self.query.get("recursive", "false").lower() in ("1", "true")
        expand = self.query.get("expand", "false").lower() in ("1", "true")
        prefix = path + "/" if path else ""
        below = [p for p in sorted(set(c.files) | dirs) if p.startswith(prefix)]
        if not recursive:
            below = [p for p in below if "/" not in p[len(prefix) :]]
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
        self._paginate(
            [
                {
                    "id": h.sha,
                    "title": h.title,
                    "message": h.message,
                    "date": iso(h.date),
                    "authors": [{"user": a} for a in h.authors],
                }
                for h in repo.history(c.sha)
            ]
        )

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
            params = [(k, v) for k, v in parse_qsl(urlsplit(self.path).query, keep_blank_values=True) if k != "cursor"]
            params.append(("cursor", base64.urlsafe_b64encode(str(end).encode()).decode().rstrip("=")))
            host = self.headers.get("Host") or "{}:{}".format(*self.server.server_address[:2])
            headers["Link"] = f'<http://{host}{urlsplit(self.path).path}?{urlencode(params)}>; rel="next"'
        self._send_json(items[start:end], headers)

    # -- file downloads ------------------------------------------------------------------------

    def _resolve(self, repo_type: str, repo_id: str, rev: str, path: str) -> None:
        if self.command not in ("GET", "HEAD"):
            return self._not_found()
        repo = self._repo(repo_type, repo_id)
        c = self._commit(repo, rev)
        meta, headers = self._file_headers(c, path, rev)
        lfs = meta.size >= self.hub.lfs_threshold
        if not self.hub.redirects:
            return self._serve_bytes(c.files[path], headers)
        del headers["Accept-Ranges"]
        if lfs:
            # The real Hub: 302 to a signed CDN URL; the metadata rides on the 302 itself.
            return self._redirect(302, "Found", self.hub._cdn_location(c, path, meta), headers)
        # The real Hub: 307 to its own resolve-cache, a *relative* Location on the same host.
        location = f"/api/resolve-cache/{repo_type}s/{quote(repo_id)}/{c.sha}/{quote(path)}?etag=%22{meta.oid}%22"
        return self._redirect(307, "Temporary Redirect", location, headers)

    def _resolve_cache(self, rest: list[str]) -> None:
        """`/api/resolve-cache/{type}s/{org}/{name}/{sha}/{path}`: where a small file's 307 points."""
        if self.command not in ("GET", "HEAD") or len(rest) < 5 or rest[0] not in REPO_TYPES:
            return self._not_found()
        repo = self._repo(REPO_TYPES[rest[0]], f"{rest[1]}/{rest[2]}")
        sha, path = rest[3], "/".join(rest[4:])
        if repo.resolve_ref(sha) != sha:  # a commit sha only; a force-pushed-away one is gone
            raise HubError(404, "RevisionNotFound", f"Invalid rev id: {sha}")
        c = repo.commits[sha]
        _, headers = self._file_headers(c, path, sha)
        self._serve_bytes(c.files[path], headers)

    def _file_headers(self, c: Commit, path: str, rev: str) -> tuple[FileMeta, dict]:
        if path not in c.meta:
            raise HubError(
                404, "EntryNotFound", f'{path} does not exist on "{rev}"', {"X-Repo-Commit": c.sha}
            )  # lets the client record .no_exist/<sha>/<path>
        meta = c.meta[path]
        headers = {"X-Repo-Commit": c.sha, "Accept-Ranges": "bytes"}
        if meta.size >= self.hub.lfs_threshold:
            headers.update(
                {"ETag": f'"{meta.sha256}"', "X-Linked-Etag": f'"{meta.sha256}"', "X-Linked-Size": meta.size}
            )
        else:
            headers["ETag"] = f'"{meta.oid}"'
        return meta, headers

    def _redirect(self, status: int, reason: str, location: str, headers: dict) -> None:
        body = f"{reason}. Redirecting to {location}".encode()  # Content-Length: this body's
        self._send(status, body, {**headers, "Location": location}, "text/plain; charset=utf-8")


def _last_touch(repo: FakeRepo, c: Commit, path: str) -> Commit:
    """The newest commit in c's history that changed `path` (file oid or directory contents)."""

    def key(commit: Commit):
        return commit.meta[path].oid if path in commit.meta else commit.dir_oid(path)

    history = repo.history(c.sha)
    for newer, older in zip(history, history[1:], strict=False):
        if key(newer) != key(older):
            return newer
    return history[-1]
