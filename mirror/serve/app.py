"""The mirror as a Hub endpoint: the API subset `huggingface_hub` and `kernels` use, read-only.

Routing is on the raw path (`scope["raw_path"]`), split on "/" before percent-decoding:
clients send revisions like `release/v1` as one segment, `release%2Fv1`, which a decoded
path would split in two. Nothing here builds a filesystem path from the request: files are
looked up by their repo path in the catalog, so no input can reach outside the store.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from urllib.parse import parse_qs

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .catalog import Catalog, ServedCommit, ServedFile, ServedRepo, dir_oid, etag_of
from .protocol import HubError, parse_range, split_raw_path

REPO_TYPES = {"models": "model", "kernels": "kernel", "datasets": "dataset", "spaces": "space"}
PREFIXES = {"kernels": "kernel", "datasets": "dataset", "spaces": "space"}
CHUNK = 4 << 20
PAGE, PAGE_EXPAND, COMMITS_PAGE = 1000, 50, 100


class MirrorApp:
    """ASGI app. `catalog()` returns the current index; `authorized(header)` checks a bearer token."""

    def __init__(self, catalog: Callable[[], Catalog], authorized: Callable[[str | None], bool]):
        self.catalog = catalog
        self.authorized = authorized

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        try:
            if not self.authorized(request.headers.get("authorization")):
                raise HubError(401, "Unauthorized", "Invalid or missing token for this mirror")
            response = await self.dispatch(request)
        except HubError as e:
            response = e.response(head=request.method == "HEAD")
        await response(scope, receive, send)

    async def dispatch(self, request: Request) -> Response:
        segs = split_raw_path(request.scope.get("raw_path") or request.scope["path"].encode())
        method = request.method
        if segs[:1] == ["api"]:
            return await self.api(request, segs[1:], method)
        if method in ("GET", "HEAD"):
            typed = len(segs) >= 5 and segs[0] in PREFIXES and segs[3] == "resolve"
            if typed or (len(segs) >= 4 and segs[2] == "resolve"):
                repo_type, rest = (PREFIXES[segs[0]], segs[1:]) if typed else ("model", segs)
                return self.resolve(request, repo_type, f"{rest[0]}/{rest[1]}", rest[3], "/".join(rest[4:]))
        raise HubError(404, None, "Not found")

    async def api(self, request: Request, segs: list[str], method: str) -> Response:
        if segs == ["agent-harnesses"]:
            raise HubError(404, None, "Not found")
        if len(segs) == 3 and segs[0] == "organizations" and segs[2] == "overview" and method == "GET":
            org = segs[1]
            return JSONResponse({"name": org, "fullname": org,
                                 "trustedKernelPublisher": org in self.catalog().trusted})
        if len(segs) < 3 or segs[0] not in REPO_TYPES:
            raise HubError(404, None, "Not found")
        repo = self.repo(REPO_TYPES[segs[0]], f"{segs[1]}/{segs[2]}")
        rest = segs[3:]
        if method == "GET" and (not rest or (rest[0] == "revision" and len(rest) == 2)):
            return self.info(repo, rest[1] if rest else "main")
        if method == "GET" and rest == ["refs"]:
            return self.refs(request, repo)
        if method == "GET" and len(rest) >= 2 and rest[0] == "tree":
            return self.tree(request, repo, rest[1], "/".join(rest[2:]))
        if method == "POST" and len(rest) == 2 and rest[0] == "paths-info":
            return await self.paths_info(request, repo, rest[1])
        if method == "GET" and len(rest) == 2 and rest[0] == "commits":
            return self.commits(request, repo, rest[1])
        raise HubError(404, None, "Not found")

    # -- repos and revisions -------------------------------------------------------------------

    def repo(self, repo_type: str, repo_id: str) -> ServedRepo:
        repo = self.catalog().repo(repo_type, repo_id)
        if repo is None:
            raise HubError(404, "RepoNotFound", f"Repository not found: {repo_id} is not staged on this mirror")
        return repo

    def commit(self, repo: ServedRepo, rev: str) -> ServedCommit:
        sha = repo.resolve(rev)
        if sha is None:
            raise HubError(404, "RevisionNotFound", f"Invalid rev id: {rev} is not staged for {repo.repo_id}")
        return repo.commits[sha]

    def info(self, repo: ServedRepo, rev: str) -> Response:
        c = self.commit(repo, rev)
        return JSONResponse({
            "id": repo.repo_id, "sha": c.sha, "author": repo.repo_id.split("/")[0], "private": False,
            "gated": False, "disabled": False, "lastModified": _iso(c.date), "tags": [], "downloads": 0, "likes": 0,
            "siblings": [{"rfilename": p} for p in sorted(c.files)],
        })

    def refs(self, request: Request, repo: ServedRepo) -> Response:
        def refs(d: dict[str, str], kind: str) -> list[dict]:
            return [{"name": n, "ref": f"refs/{kind}/{n}", "targetCommit": sha} for n, sha in sorted(d.items())]

        body = {"branches": refs(repo.branches, "heads"), "tags": refs(repo.tags, "tags"), "converts": []}
        if "include_prs" in request.query_params:
            body["pullRequests"] = []
        return JSONResponse(body)

    # -- listings ------------------------------------------------------------------------------

    def tree(self, request: Request, repo: ServedRepo, rev: str, path: str) -> Response:
        c = self.commit(repo, rev)
        recursive = request.query_params.get("recursive", "false").lower() == "true"
        expand = request.query_params.get("expand", "false").lower() == "true"
        path = path.strip("/")
        dirs = c.dirs()
        if path and path not in dirs:
            raise HubError(404, "EntryNotFound", f"{path} does not exist on {rev}", {"X-Repo-Commit": c.sha})
        prefix = f"{path}/" if path else ""
        names = [p for p in list(c.files) + sorted(dirs) if p.startswith(prefix) and p != path]
        if not recursive:
            names = [p for p in names if "/" not in p[len(prefix):]]
        entries = [self.entry(c, p, expand) for p in sorted(names)]
        return paginate(request, entries, PAGE_EXPAND if expand else PAGE)

    async def paths_info(self, request: Request, repo: ServedRepo, rev: str) -> Response:
        c = self.commit(repo, rev)
        body = await request.body()
        if request.headers.get("content-type", "").startswith("application/json"):
            try:
                doc = json.loads(body or b"{}")
            except ValueError:
                raise HubError(400, None, "Malformed JSON body") from None
            paths, expand = doc.get("paths", []), bool(doc.get("expand", False))
        else:
            form = parse_qs(body.decode("utf-8", "replace"))
            paths, expand = form.get("paths", []), form.get("expand", ["false"])[0].lower() == "true"
        if isinstance(paths, str):
            paths = [paths]
        dirs = c.dirs()
        known = [p.strip("/") for p in paths if isinstance(p, str) and (p.strip("/") in c.files or p.strip("/") in dirs)]
        return JSONResponse([self.entry(c, p, expand) for p in dict.fromkeys(known)])

    def entry(self, c: ServedCommit, path: str, expand: bool) -> dict:
        f = c.files.get(path)
        e = f.tree_entry() if f else {"type": "directory", "oid": dir_oid(c.sha, path), "path": path}
        if expand:
            e["lastCommit"] = {"id": c.sha, "title": c.title, "date": _iso(c.date)}
        return e

    def commits(self, request: Request, repo: ServedRepo, rev: str) -> Response:
        c = self.commit(repo, rev)
        items = []
        for sha in repo.logs.get(c.sha, [c.sha]):
            date, title = repo.meta.get(sha, (None, ""))
            items.append({"id": sha, "title": title, "message": "", "date": _iso(date),
                          "authors": [{"user": repo.repo_id.split("/")[0]}]})
        return paginate(request, items, COMMITS_PAGE)

    # -- files -----------------------------------------------------------------------------------

    def resolve(self, request: Request, repo_type: str, repo_id: str, rev: str, path: str) -> Response:
        repo = self.repo(repo_type, repo_id)
        c = self.commit(repo, rev)
        f = c.files.get(path)
        if f is None:
            raise HubError(404, "EntryNotFound", f"{path} is not staged at {rev}", {"X-Repo-Commit": c.sha})
        headers = {"X-Repo-Commit": c.sha, "ETag": f'"{etag_of(f)}"', "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream"}
        if f.lfs:
            headers.update({"X-Linked-Etag": f'"{f.sha256}"', "X-Linked-Size": str(f.size)})
        rng = parse_range(request.headers.get("range"), f.size)
        if rng == "unsatisfiable":
            raise HubError(416, None, "Requested Range Not Satisfiable",
                           {"Content-Range": f"bytes */{f.size}", "X-Repo-Commit": c.sha})
        start, end, status = 0, f.size, 200
        if rng is not None:
            (start, end), status = rng, 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{f.size}"
        headers["Content-Length"] = str(end - start)
        if request.method == "HEAD":
            return Response(status_code=status, headers=headers)
        return BlobResponse(f, start, end, status, headers)


class BlobResponse(Response):
    """Streams a byte range of a store blob in large chunks read off the event loop."""

    def __init__(self, f: ServedFile, start: int, end: int, status: int, headers: dict):
        super().__init__(status_code=status, headers=headers)
        self.file, self.start, self.end = f, start, end

    async def __call__(self, scope, receive, send):
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        fd = os.open(self.file.blob, os.O_RDONLY)
        try:
            off = self.start
            while off < self.end:
                n = min(CHUNK, self.end - off)
                chunk = await anyio.to_thread.run_sync(os.pread, fd, n, off)
                if not chunk:
                    break
                off += len(chunk)
                await send({"type": "http.response.body", "body": chunk, "more_body": off < self.end})
            if off == self.start:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            os.close(fd)


def paginate(request: Request, items: list, size: int) -> Response:
    """`Link: <absolute url>; rel="next"`, as the Hub pages (huggingface_hub follows it verbatim)."""
    try:
        start = max(0, int(request.query_params.get("cursor", "0")))
    except ValueError:
        raise HubError(400, None, "Bad cursor") from None
    page = items[start:start + size]
    headers = {}
    if start + size < len(items):
        url = request.url.include_query_params(cursor=start + size)
        headers["Link"] = f'<{url}>; rel="next"'
    return JSONResponse(page, headers=headers)


def _iso(dt) -> str:
    return (dt.strftime("%Y-%m-%dT%H:%M:%S.000Z") if dt else "1970-01-01T00:00:00.000Z")
