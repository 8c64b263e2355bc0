"""The mirror as a Hub endpoint: the API subset `huggingface_hub` and `kernels` use, read-only.

Routing is on the raw path (`scope["raw_path"]`), split on "/" before percent-decoding: clients send revisions like
`release/v1` as one segment, `release%2Fv1`, which a decoded path would split in two. Nothing here builds a filesystem
path from the request: files are looked up by their repo path in the catalog, so no input can reach outside the store.

Behind nginx (`serve --accel-redirect PREFIX`, with the config `frt-mirror nginx-conf` prints), a GET of a file is
answered with its headers and `X-Accel-Redirect: PREFIX/<blob under the store>`, no body: nginx sends the bytes from
its `internal` location over the store (sendfile, Range). Only requests nginx marked (`X-Sendfile-Type:
X-Accel-Redirect`) are redirected, so a client that reaches a replica directly still gets the bytes, and only those
nginx answers exactly as serve would (accel.py). A blob is handed off only once this process has verified it as it is
now (integrity.py: nginx sends bytes that serve never sees, so they are hashed before, not as they go).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from frt.manifests.fields import org_problem

from . import simple
from .accel import accel_headers, accel_ok
from .accesslog import AccessLog, Counted
from .blob import BlobResponse, FileIntegrity, file_headers
from .catalog import Catalog, ServedCommit, ServedFile, ServedRepo, dir_oid, etag_of
from .demand import DemandRecorder
from .demand_rollup import receive_demand
from .hot import HotEntry, HotTable
from .objects import ObjectIntegrity, ObjectResponse
from .pin import marked
from .protocol import (
    TOKEN_HINT,
    TOKEN_MESSAGE,
    BodyRequest,
    HubError,
    info_body,
    iso_time,
    paginate,
    parse_range,
    public_route,
    read_paths_info,
    split_raw_path,
    split_revision,
)
from .pull import STALE_HEADER, PullService
from .pulled import pulled

if TYPE_CHECKING:  # what make_app (run.py) sets; a bare app has neither
    from .metrics import Metrics
    from .page import OperatorRoutes

log = logging.getLogger("frt.serve")
REPO_TYPES = {"models": "model", "kernels": "kernel", "datasets": "dataset", "spaces": "space"}
PREFIXES = {"kernels": "kernel", "datasets": "dataset", "spaces": "space"}
PAGE, PAGE_EXPAND, COMMITS_PAGE = 1000, 50, 100
Answer = Response | ObjectResponse  # what a route answers (an object store's file is an ObjectResponse)


class MirrorApp:
    """ASGI app. `catalog()` returns the current index; `authorized(header)` checks a bearer token; `log`, if given,
    gets one record per request (serve's access log); `accel_redirect`, if set, is the path of nginx's internal
    location over the store (serve --accel-redirect; set before serving). `metrics` (metrics.Metrics) counts every
    request; `operator` (page.OperatorRoutes) answers `/`, `/-/…` and `/metrics` before the Hub API is routed;
    make_app sets both, and `integrity` (what this process verified and quarantined: integrity.py) over the home."""

    def __init__(
        self,
        catalog: Callable[[], Catalog],
        authorized: Callable[[str | None], bool],
        log: AccessLog | None = None,
        accel_redirect: str | None = None,
        pull: PullService | None = None,
    ) -> None:
        self.catalog, self.authorized = catalog, authorized
        self.pull = pull  # serve --upstream: misses of allowed repos go to the upstream (see pull.py)
        self._token_noted = False
        self.log, self.accel_redirect = log, accel_redirect
        self._hot = HotTable()  # answers given before, by raw path: see hot() and fast_head()
        self.metrics: Metrics | None = None
        self.operator: OperatorRoutes | None = None
        self.integrity: FileIntegrity | ObjectIntegrity = FileIntegrity()
        self.demand = DemandRecorder()  # what kernels clients ask for (demand.py); make_app gives it the ledger

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            if self.log:  # a worker of serve --workers exits right after: its last lines go out now
                self.log.sink.flush()
            if self.metrics:
                self.metrics.flush()
            self.demand.flush()
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        t0, log, metrics = time.perf_counter(), self.log, self.metrics
        # Counted.last counts an answer as its last bytes are handed on; without log or metrics, send itself.
        last = functools.partial(metrics.request, scope) if metrics else None
        counted: Counted = Counted(send, last) if log or metrics else send  # type: ignore[assignment]
        try:
            if scope["method"] not in ("GET", "HEAD") or await self.hot(scope, receive, counted) is None:
                await self.answer(scope, receive, counted)
        finally:
            if log:
                log.record(scope, counted.status, counted.nbytes, t0)
            if metrics and counted.last is not None:  # no last message went: cut short, or failed
                metrics.request(scope, counted.status, counted.nbytes)

    async def answer(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Every request the hot path did not take: routing, then a response or a HubError's."""
        request = BodyRequest(scope, receive)
        try:
            auth = request.headers.get("authorization")
            if not self.authorized(auth) and not public_route(scope):
                self._note_token(auth)
                raise HubError(401, "Unauthorized", TOKEN_MESSAGE)
            response = await self.dispatch(request)
        except HubError as e:
            response = e.response(head=request.method == "HEAD")
        if (stale := scope.get("frt.stale")) is not None:
            said = (STALE_HEADER.lower().encode(), stale.encode("ascii", "replace"))
            response.raw_headers = [*response.raw_headers, said]
        request.settle(response)
        await response(scope, receive, send)

    def _note_token(self, auth: str | None) -> None:
        """Once per process, in serve's log: the first request refused for want of any token."""
        if auth is None and not self._token_noted:
            self._token_noted = True
            log.warning("a request without a token was refused (401): %s", TOKEN_HINT)

    async def hot(self, scope: Scope, receive: Receive, send: Send) -> tuple[int, int] | None:
        """Answer a whole-file resolve URL that was answered before, from the hot table (hot.py): no
        routing, no Starlette; the token still checked every time. The status and body bytes sent; None
        where the table declines (the slow way says why), or a blob not verified lately for nginx."""
        found = self._hot.hit(scope, self.catalog(), self.integrity.bad, self.authorized)
        if found is None:
            return None
        (_, f, headers, accel, _), nginx = found
        head = scope["method"] == "HEAD"
        if nginx and accel and self.accel_redirect and not head:  # nginx sends bytes unhashed: a blob verified lately
            if (where := self.integrity.handoff(f, self.accel_redirect)) is None:
                return None  # the slow way verifies it
            return 200, await BlobResponse(f, 0, 0, 200, (*accel, *where), head=True)(scope, receive, send)
        answer = self.integrity.response(f, 0, f.size, 200, headers, head=head)
        sent = await answer(scope, receive, send)  # first: the answer may change its status (a 500, a 302)
        return answer.status_code, sent

    def fast_head(self, scope: Scope, t0: float) -> bytes | None:
        """A HEAD that hot() would answer, answered by the HTTP protocol itself (limits.guarded): its
        header lines, encoded once per URL, after logging and counting it as hot() does. No ASGI task,
        no response object: at 64 clients in flight a HEAD costs about a third less (bench/serve.py).
        None (the request goes through the app as before): see protocol_hit."""
        if (found := self.protocol_hit(scope)) is None:
            return None
        self.record_hot(scope, 200, 0, t0)
        return found[0].lines

    def protocol_hit(self, scope: Scope) -> tuple[HotEntry, bool] | None:
        """The hot table's hit for what the HTTP protocol answers itself (fast_head, sendfile.hot_get);
        None where hot() would decline, or for a forwarded client address uvicorn's proxy headers log."""
        if any(name == b"x-forwarded-for" for name, _ in scope["headers"]):
            return None
        return self._hot.hit(scope, self.catalog(), self.integrity.bad, self.authorized)

    def record_hot(self, scope: Scope, status: int, sent: int, t0: float) -> None:
        """Log and count an answer of the hot path (hot, fast_head, sendfile.hot_get) as the slow way does."""
        if self.log:
            self.log.record(scope, status, sent, t0)
        if self.metrics:
            self.metrics.count("resolve", scope["method"], status, sent)

    async def dispatch(self, request: Request) -> Answer:
        segs = split_raw_path(request.scope.get("raw_path") or request.scope["path"].encode())
        method = request.method
        # Never a Hub route: `/`, `/metrics` and `/-/…` (`/metrics/x/resolve/…` is an org's model repo).
        if self.operator is not None and (not segs or segs == ["metrics"] or segs[0] == "-"):
            return await self.operator(request, segs)
        if segs[:1] == ["api"]:
            return await self.api(request, segs[1:], method)
        # The wheels of python-depends (simple.py); `/simple/<name>/resolve/…` is the org simple's model repo.
        if segs[:1] == ["simple"] and method in ("GET", "HEAD") and not (len(segs) >= 4 and segs[2] == "resolve"):
            return simple.answer(self.catalog(), self.integrity, segs[1:], method)
        if method in ("GET", "HEAD"):
            typed = len(segs) >= 5 and segs[0] in PREFIXES and segs[3] == "resolve"
            if typed or (len(segs) >= 4 and segs[2] == "resolve"):
                repo_type, rest = (PREFIXES[segs[0]], segs[1:]) if typed else ("model", segs)
                rev, path = split_revision(rest[3:])
                return await self.resolve(request, repo_type, f"{rest[0]}/{rest[1]}", rev, "/".join(path))
        raise HubError(404, None, "Not found")

    async def api(self, request: Request, segs: list[str], method: str) -> Answer:
        if segs == ["frt-mirror", "demand"] and method == "POST":  # a tier below's counts (demand_rollup.py)
            return await receive_demand(request, self.demand)
        if segs == ["agent-harnesses"]:
            raise HubError(404, None, "Not found")
        if len(segs) == 3 and segs[0] == "organizations" and segs[2] == "overview" and method == "GET":
            # Gated before anything: else every distinct client string (`a%2F..%2Fb`, `<script>`) was
            # asked upstream and, where the upstream vouched, kept as a publishers row, without limit.
            if problem := org_problem(org := segs[1]):
                raise HubError(404, None, f"Organization not found: {problem}")
            trusted = self.catalog().publisher_trusted(org)
            if trusted is None and self.pull is not None and self.pull.allowed(f"{org}/-"):
                trusted = await self.pull.publisher_trusted(org)
            if trusted is None:  # never recorded: not ours to vouch for (kernels then refuses, as online)
                raise HubError(404, None, f"Organization {org!r} not found on this mirror")
            return JSONResponse({"name": org, "fullname": org, "trustedKernelPublisher": trusted})
        if len(segs) < 3 or segs[0] not in REPO_TYPES:
            raise HubError(404, None, "Not found")
        rev = split_revision(segs[4:])[0] if len(segs) >= 5 else None
        # An API client can wait out the upstream's rate limit (huggingface_hub sets no timeout there).
        repo = await self.repo(request, REPO_TYPES[segs[0]], f"{segs[1]}/{segs[2]}", rev, hold=True)
        if method == "GET" and len(segs) == 3:
            return self.info(repo, repo.default())
        if method in ("GET", "HEAD") and segs[3:] == ["refs"]:  # HEAD: GET's headers, uvicorn drops the body
            return self.refs(request, repo)
        if len(segs) < 5:
            raise HubError(404, None, "Not found")
        route, (rev, rest) = segs[3], split_revision(segs[4:])
        if method == "GET" and route == "revision" and not rest:
            return self.info(repo, rev)
        if method == "GET" and route == "tree":
            return self.tree(request, repo, rev, "/".join(rest))
        if method == "POST" and route == "paths-info" and not rest:
            return await self.paths_info(request, repo, rev)
        if method == "GET" and route == "commits" and not rest:
            return self.commits(request, repo, rev)
        raise HubError(404, None, "Not found")

    # -- repos and revisions -------------------------------------------------------------------

    async def repo(
        self, request: Request, repo_type: str, repo_id: str, rev: str | None = None, hold: bool = False
    ) -> ServedRepo:
        """The staged repo; with pull-through, an allowed repo as the upstream has it (see pull.py)."""
        repo = stale = None
        if self.pull is not None and self.pull.allowed(repo_id):
            repo, stale = await self.pull.repo(repo_type, repo_id, rev, hold=hold)
            if stale is not None:
                request.scope["frt.stale"] = stale
        repo = repo or self.catalog().repo(repo_type, repo_id)
        if repo is None and stale is not None and self.pull is not None:  # nobody could ask: not a 404
            raise self.pull.not_askable(repo_type, repo_id, stale)
        if repo is None:
            if self.pull is None or not self.pull.by_wildcard(repo_id):  # '*': the upstream has no such repo
                self.demand.missed_repo(request.scope, repo_id)
            where = self.catalog().staged_as(repo_type, repo_id)  # the Hub's answer, and where it is staged
            raise HubError(404, "RepoNotFound", f"Repository not found: {repo_id} is not staged on this mirror{where}")
        return repo

    def commit(self, repo: ServedRepo, rev: str) -> ServedCommit:
        sha = repo.resolve(rev)
        if sha is None:
            known = repo.unstaged_version(rev)
            why = f" ({known} is on record upstream, not staged here; frt-mirror report --demand)" if known else ""
            raise HubError(404, "RevisionNotFound", f"Invalid rev id: {rev} is not staged for {repo.repo_id}{why}")
        return repo.commits[sha]

    def info(self, repo: ServedRepo, rev: str) -> Response:
        c = self.commit(repo, rev)
        return JSONResponse(info_body(repo.repo_id, c.sha, c.date, c.files))

    def refs(self, request: Request, repo: ServedRepo) -> Response:
        def refs(d: dict[str, str], kind: str) -> list[dict[str, str]]:
            return [{"name": n, "ref": f"refs/{kind}/{n}", "targetCommit": sha} for n, sha in sorted(d.items())]

        branches = {**self.demand.unstaged_refs(request.scope, repo.unstaged), **repo.branches}
        body = {"branches": refs(branches, "heads"), "tags": refs(repo.tags, "tags"), "converts": []}
        if "include_prs" in request.query_params:
            body["pullRequests"] = []
        return JSONResponse(body)

    # -- listings ------------------------------------------------------------------------------

    def tree(self, request: Request, repo: ServedRepo, rev: str, path: str) -> Response:
        path = path.strip("/")
        try:
            c = self.commit(repo, rev)
        except HubError:
            if path == "build":  # kernels' first ask of a revision (get_variants)
                self.demand.missed(request.scope, repo, rev)
            raise
        recursive = request.query_params.get("recursive", "false").lower() == "true"
        expand = request.query_params.get("expand", "false").lower() == "true"
        dirs = c.dirs()
        if path and path not in dirs:
            raise HubError(404, "EntryNotFound", f"{path} does not exist on {rev}", {"X-Repo-Commit": c.sha})
        prefix = f"{path}/" if path else ""
        names = [p for p in list(c.files) + sorted(dirs) if p.startswith(prefix) and p != path]
        if not recursive:
            names = [p for p in names if "/" not in p[len(prefix) :]]
        entries = [self.entry(c, p, expand) for p in sorted(names)]
        if path == "build":
            self.demand.listed(
                request.scope, repo, rev, c.sha, [p[6:] for p in names if p in dirs and p.count("/") == 1]
            )
        return paginate(request, entries, PAGE_EXPAND if expand else PAGE)

    async def paths_info(self, request: Request, repo: ServedRepo, rev: str) -> Response:
        c = self.commit(repo, rev)
        paths, expand = await read_paths_info(request)
        dirs = c.dirs()
        known = [
            p.strip("/") for p in paths if isinstance(p, str) and (p.strip("/") in c.files or p.strip("/") in dirs)
        ]
        return JSONResponse([self.entry(c, p, expand) for p in dict.fromkeys(known)])

    def entry(self, c: ServedCommit, path: str, expand: bool) -> dict[str, Any]:
        f = c.files.get(path)
        e: dict[str, Any] = f.tree_entry() if f else {"type": "directory", "oid": dir_oid(c.sha, path), "path": path}
        if expand:
            e["lastCommit"] = {"id": c.sha, "title": c.title, "date": iso_time(c.date)}
        return e

    def commits(self, request: Request, repo: ServedRepo, rev: str) -> Response:
        c = self.commit(repo, rev)
        items = []
        for sha in repo.logs.get(c.sha, [c.sha]):
            date, title = repo.meta.get(sha, (None, ""))
            items.append(
                {
                    "id": sha,
                    "title": title,
                    "message": "",
                    "date": iso_time(date),
                    "authors": [{"user": repo.repo_id.split("/")[0]}],
                }
            )
        return paginate(request, items, COMMITS_PAGE)

    # -- files -----------------------------------------------------------------------------------

    async def resolve(self, request: Request, repo_type: str, repo_id: str, rev: str, path: str) -> Answer:
        catalog = self.catalog()
        repo = await self.repo(request, repo_type, repo_id, rev)
        c = self.commit(repo, rev)
        f = c.files.get(path)
        if f is None:
            raise HubError(404, "EntryNotFound", f"{path} is not staged at {rev}", {"X-Repo-Commit": c.sha})
        again = self.pull is not None and self.pull.allowed(repo_id) and marked(request.scope)  # evicted: pin.py
        if f.blob is not None and (again or self.integrity.refused(f)):  # bad: a 500, or with --upstream fetched again
            if self.pull is None or not self.pull.allowed(repo_id):
                raise self.integrity.error(f)
            f = dataclasses.replace(f, blob=None)
        if f.blob is None and request.method != "HEAD":  # listed upstream, not stored: pull it now
            if self.pull is None:  # only pull-through lists a file it does not store: no bytes to answer with
                raise HubError(404, "EntryNotFound", f"{path} at {rev} is not stored on this mirror")
            answer = await pulled(self.pull, repo, c.sha, f, self.integrity, request.scope)  # or passed through
            if not isinstance(answer, ServedFile):
                return answer
            f = answer
        rng, whole = parse_range(request.headers.get("range"), f.size), False
        if (
            isinstance(rng, tuple)
            and rng[0]
            and self.pull is not None
            and self.pull.allowed(repo_id)
            and self.pull.streams(f)
            and await self.pull.unvouched(f)
        ):
            rng, whole = None, True  # once streamed unverified from a fetch that failed: a client's prefix may be bad
        if rng == "unsatisfiable":
            raise HubError(
                416,
                None,
                "Requested Range Not Satisfiable",
                {"Content-Range": f"bytes */{f.size}", "X-Repo-Commit": c.sha},
            )
        start, end = rng or (0, f.size)
        fixed = file_headers(c.sha, etag_of(f), f.sha256 if f.lfs else None, f.size)
        headers = [*fixed, (b"content-length", b"%d" % (end - start))]
        head = request.method == "HEAD"
        prefix = self.accel_redirect if not head and not whole and accel_ok(request.scope["headers"], rng) else None
        if prefix or (rng is not None and not head):  # bytes sent unhashed: the whole blob verified first
            await self.integrity.ensure(f)
        if prefix and (where := self.integrity.handoff(f, prefix)) is not None:
            return BlobResponse(f, 0, 0, 200, (*accel_headers(fixed, ranged=rng is not None), *where), head=True)
        if rng is not None:
            headers.append((b"content-range", b"bytes %d-%d/%d" % (start, end - 1, f.size)))
        elif (
            (raw := request.scope.get("raw_path"))
            and catalog is self.catalog()
            and repo is catalog.repo(repo_type, repo_id)
        ):
            accel = accel_headers(fixed, ranged=False) if self.accel_redirect else None
            self._hot.remember(raw, catalog, f, tuple(headers), accel)
        return self.integrity.response(f, start, end, 206 if rng else 200, headers, head=head)
