"""A thin client of the upstream Hub (or of another frt-mirror) over huggingface_hub's session: refs,
history, listings, small files, each org's trust. File bodies are `frt.mirror.stage.transport`'s.

Every request runs in the one retry loop (attempts.py) and is paced against the upstream's quota
(pacing.py, per hop in wire.stream).

Why the JSON routes are read here and not through `HfApi`: it reads answers whole, pages without end and
raises from inside itself on malformed JSON (see `wire`). Each answer is read bounded (`wire`) and its
shape checked where it enters (`gate.check_shape`); anything malformed is one `UpstreamMalformed` line
naming the route, never retried (the same answer would come again).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import quote

from huggingface_hub import hf_hub_url
from huggingface_hub.errors import (
    EntryNotFoundError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

# huggingface_hub.utils re-exports it lazily, through an __all__ mypy cannot read: named where it is defined.
from huggingface_hub.utils._headers import build_hf_headers

from . import wire
from .attempts import RetryPolicy, attempts
from .errors import BadInput, FrtError, UpstreamMalformed, first_line
from .gate import (
    check_commit,
    check_entry,
    check_git_oid,
    check_path,
    check_ref,
    check_sha256,
    check_shape,
    check_variant,
    endpoint_problem,
    hub_date,
)
from .once import Once
from .pacing import Item, Pacer
from .resolution import CommitInfo, FileEntry
from .small_files import SmallFiles

DEFAULT_ENDPOINT = "https://huggingface.co"
T = TypeVar("T")
PUBLISHERS_KEPT = 4096  # orgs whose overview answer a client keeps (serve --allow '*' meets orgs without end)


class RepoNotFound(BadInput):
    """Upstream says the repository does not exist (or is not visible to us)."""


class RevisionNotFound(BadInput):
    """Upstream has the repository but not that revision."""


def resolve_endpoint(endpoint: str | None, option: str = "--endpoint") -> str:
    """The upstream's URL, checked here: a malformed one is bad input at once, not seconds of retries.
    `option`: the option that gave `endpoint`, named in the error."""
    url = (endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
    if endpoint_problem(url):  # gate.py: an unclosed IPv6 bracket or a bad port was a ValueError traceback
        where = option if endpoint else "HF_ENDPOINT"
        raise BadInput(
            f"{where} {url!r} is not an upstream URL: expected http(s)://host[:port], "
            "e.g. https://huggingface.co or http://mirror:8470"
        )
    return url


def ask_only_our_endpoint() -> None:
    """Keep huggingface_hub from asking its global endpoint for anything. To build its user agent it
    fetches an agent registry (`/api/agent-harnesses`) from huggingface.co (or HF_ENDPOINT) once per
    process, whatever endpoint the client was made for: a mirror on a fenced site waited ~10 s on DNS
    for huggingface.co before its first upstream call. The registry only names AI-agent harnesses to
    mention in the user agent; this process's is set to huggingface_hub's own "none known" (what it
    falls back to offline). Not HF_HUB_DISABLE_TELEMETRY, which also skips it: kernels 0.17 then sends
    a malformed user agent (see README, Notes for operators), and it would hold for the whole process.
    A huggingface_hub without that registry is left as it is."""
    try:
        from huggingface_hub.utils import _detect_agent as agent
    except ImportError:
        return
    if getattr(agent, "_registry", False) is None and isinstance(getattr(agent, "_EMPTY_REGISTRY", None), dict):
        agent._registry = agent._EMPTY_REGISTRY


class HubClient:
    def __init__(
        self,
        endpoint: str | None = None,
        *,
        token: str | None = None,
        retry: RetryPolicy | None = None,
        pacer: Pacer | None = None,
        limits: wire.Limits | None = None,
    ):
        ask_only_our_endpoint()
        self.endpoint = resolve_endpoint(endpoint)
        self.token, self.retry = token, retry or RetryPolicy.from_env()
        self.limits = limits or wire.Limits.from_env()
        # Each org once per run, whichever repos ask; a serve's client lives for months: the newest answers kept.
        self._publishers: Once[str, bool | None] = Once(keep=PUBLISHERS_KEPT)
        self.pacer = pacer or Pacer()  # shared by every thread of a run, API calls and file transfers alike
        self.scanned: set[str] = set()  # repos this run has scanned (resolve.refresh_and_decide: once per run)
        self.small = SmallFiles()  # small files this run read and checked (scan's metadata.json): small_files.py

    def refs(self, repo_id: str, repo_type: str = "kernel") -> dict[tuple[str, str], str]:
        where = f"upstream refs of {repo_id}"
        doc = check_shape(
            self._call(lambda: self._json(f"{self._api(repo_type, repo_id)}/refs", where), repo_id, where=where),
            "refs",
            where=where,
        )
        out = {}
        # A name becomes refs/<name> in an exported cache, a commit a folder of views and snapshots.
        for kind, key in (("branch", "branches"), ("tag", "tags")):
            for i, ref in enumerate(doc[key]):
                check_shape(ref, "ref", where=where, what=f"{key}[{i}]")
                name = check_ref(ref["name"], where=where, what=f"{kind} name")
                out[(kind, name)] = check_commit(ref["targetCommit"], where=where, what=f"{kind} {name!r} target")
        return out

    def publisher_trusted(self, org: str) -> bool | None:
        """The upstream's `trustedKernelPublisher` for an org; None when the upstream has no
        overview for it (a user namespace, or a Hub without the route)."""
        where = f"upstream overview of org {org}"

        def overview() -> bool | None:
            # The same route and JSON key kernels reads (HfApi 1.x sent it to the global endpoint).
            try:
                doc = self._json(f"{self.endpoint}/api/organizations/{quote(org, safe='')}/overview", where)
            except HfHubHTTPError as e:
                if getattr(e.response, "status_code", None) in (401, 404):
                    return None
                raise
            return check_shape(doc, "overview", where=where).get("trustedKernelPublisher") is True

        return self._publishers.get(org, lambda: self._call(overview, org, where=where))

    def revision_sha(self, repo_id: str, revision: str, repo_type: str = "kernel") -> str:
        where = f"upstream info of {repo_id}@{revision}"
        url = f"{self._api(repo_type, repo_id)}/revision/{quote(revision, safe='')}"
        doc = check_shape(self._call(lambda: self._json(url, where), repo_id, where=where), "info", where=where)
        return check_commit(doc["sha"], where=where)

    def history(self, repo_id: str, revision: str, repo_type: str = "kernel") -> list[CommitInfo]:
        """What the upstream lists as `revision`'s history, newest first, in its order (by date across
        merges; the Hub names no parents, so none is claimed)."""
        where = f"upstream history of {repo_id}@{revision[:12]}"
        url = f"{self._api(repo_type, repo_id)}/commits/{quote(revision, safe='')}"
        out = []
        for i, c in enumerate(self._pages(url, repo_id, where)):
            check_shape(c, "commit", where=where, what=f"commit {i}")
            out.append(CommitInfo(check_commit(c["id"], where=where), hub_date(c["date"]), c.get("title") or ""))
        return out

    def build_listing(
        self, repo_id: str, sha: str, repo_type: str = "kernel", item: Item | None = None
    ) -> dict[str, list[FileEntry]]:
        """Every file under build/ at a commit, grouped by variant directory; {} without build/.
        `item`: the listing as an item of the run's work (Pacer.work): its pages go in its place in line."""
        try:
            entries, where = self._tree(repo_id, sha, repo_type, "build", item)
        except _EntryMissing:
            return {}
        variants: dict[str, list[FileEntry]] = {}
        for e in entries:
            # Asked for build/ only: anything else, or anything climbing out, is a hostile answer.
            parts = check_path(e["path"], where=where, under="build/").split("/")
            if e["type"] == "file" and len(parts) == 2:
                continue  # a file beside the variant dirs (build/README) is no variant
            bucket = variants.setdefault(check_variant(parts[1], where=where), [])
            if e["type"] == "file":
                bucket.append(_file_entry(e, where))
        return variants

    def repo_listing(self, repo_id: str, sha: str, repo_type: str = "model") -> list[FileEntry]:
        """Every file of a repo at a commit (a model repo: no build/ layout to group by)."""
        entries, where = self._tree(repo_id, sha, repo_type)
        return [_file_entry(e, where) for e in entries if e["type"] == "file" and check_path(e["path"], where=where)]

    def fetch_small_file(
        self, repo_id: str, path: str, revision: str, repo_type: str = "kernel", size: int | None = None
    ) -> bytes:
        """GET a small file (metadata.json) into memory, never more than its listed `size` nor
        FRT_MAX_METADATA_BYTES (wire.TooLarge past either); never touches a Hub cache."""
        where = f"upstream file {repo_id}/{path}@{revision[:12]}"
        cap = self.limits.metadata_bytes if size is None else min(size, self.limits.metadata_bytes)
        if size is not None and size > cap:
            raise wire.TooLarge(f"{where}: listed at {size} bytes, over the {cap}-byte limit (FRT_MAX_METADATA_BYTES)")
        url = self.file_url(repo_id, path, revision, repo_type)
        return self._call(
            lambda: (
                wire.get(
                    url,
                    headers=self._headers(),
                    deadline=self.limits.deadline(cap),
                    cap=cap,
                    what=where,
                    limit_name="its listed size",
                    pacer=self.pacer,
                ).body
            ),
            repo_id,
            where=where,
        )

    def file_url(self, repo_id: str, path: str, revision: str, repo_type: str = "kernel") -> str:
        return hf_hub_url(repo_id, path, repo_type=repo_type, revision=revision, endpoint=self.endpoint)

    # -- the routes' plumbing ----------------------------------------------------------------------

    def _api(self, repo_type: str, repo_id: str) -> str:
        return f"{self.endpoint}/api/{repo_type}s/{repo_id}"

    def _headers(self) -> dict[str, str]:
        return build_hf_headers(token=self.token)

    def _json(self, url: str, where: str, params: wire.Params | None = None) -> object:
        return wire.get_json(
            url, headers=self._headers(), limits=self.limits, what=where, params=params, pacer=self.pacer
        )

    def _pages(
        self,
        url: str,
        repo_id: str,
        where: str,
        params: wire.Params | None = None,
        item: Item | None = None,
    ) -> list[Any]:
        """Every entry of a paged listing, bounded (wire.pages). A page is the unit of retry: one refused
        (a 429, a dropped connection) is asked again, and the listing goes on from there with the pages
        it has; it never starts again from the first. Its pages are admitted in the order of the
        listing's start (Pacer.slot `since`), and all of them are under one deadline (less the time they
        waited for a rate-limit window): pages without end stop there, or at FRT_MAX_PAGES."""
        since, deadline = item.since if item else self.pacer.now(), self.limits.deadline()

        def page(at: str, query: wire.Params | None) -> wire.Got:
            if item is not None:
                item.request()
            return self._call(
                lambda: wire.get(
                    at,
                    headers=self._headers(),
                    deadline=deadline,
                    cap=self.limits.api_bytes,
                    what=where,
                    params=query,
                    pacer=self.pacer,
                    since=since,
                ),
                repo_id,
                where=where,
            )

        return list(itertools.chain.from_iterable(wire.pages(url, page, limits=self.limits, what=where, params=params)))

    def _tree(
        self, repo_id: str, sha: str, repo_type: str, path: str = "", item: Item | None = None
    ) -> tuple[list[dict[str, Any]], str]:
        """A recursive tree listing, each entry's shape checked, no path twice; and its `where`."""
        where = f"upstream listing of {repo_id}@{sha[:12]}"
        url = f"{self._api(repo_type, repo_id)}/tree/{quote(sha, safe='')}" + (
            f"/{quote(path, safe='')}" if path else ""
        )
        entries = self._pages(url, repo_id, where, params={"recursive": True, "expand": False}, item=item)
        seen: set[str] = set()
        for i, e in enumerate(entries):
            check_entry(e, where=where, what=f"entry {i}")
            if e["path"] in seen:  # one row per path in the ledger: a second would be a constraint error
                raise UpstreamMalformed(f"{where}: entry {i}: path {e['path']!r} is listed twice")
            seen.add(e["path"])
        return entries, where

    def ask(self, fn: Callable[[], T], *, host: str, where: str) -> T:
        """Run a call to another upstream of the site's (a package index) under this client's retries, its
        errors named by `host` (its requests are paced by their own host's accounts: pass `pacer`)."""
        return self.attempts(fn, where=where, host=host)

    def _call(self, fn: Callable[[], T], repo_id: str, where: str | None = None) -> T:
        """One Hub API call: `attempts`, with the Hub's own errors mapped to ours."""

        def hub_errors(e: Exception) -> Exception | None:
            if isinstance(e, RepositoryNotFoundError):
                return RepoNotFound(f"{repo_id}: repository not found at {self.endpoint} ({first_line(e)})")
            if isinstance(e, RevisionNotFoundError):
                return RevisionNotFound(f"{repo_id}: {first_line(e)}")
            if isinstance(e, EntryNotFoundError):
                return _EntryMissing()
            return None

        return self.attempts(fn, where=where or f"upstream {self.endpoint}", classify=hub_errors)

    def attempts(
        self,
        fn: Callable[[], T],
        *,
        where: str,
        host: str | None = None,
        classify: Callable[[Exception], Exception | None] | None = None,
        prefix: str = "",
    ) -> T:
        """`fn` in the one retry loop (resolver/attempts.py), under this client's policy."""
        return attempts(fn, retry=self.retry, where=where, host=host or self.endpoint, classify=classify, prefix=prefix)


class _EntryMissing(FrtError):
    pass


def _file_entry(e: dict[str, Any], where: str) -> FileEntry:
    """A listed file (its shape checked by gate.check_entry), its hashes checked too: they name blobs in
    the store and in exported caches."""
    sha256 = check_sha256(e["lfs"]["oid"], where=where) if e.get("lfs") else None
    return FileEntry(e["path"], e["size"], check_git_oid(e["oid"], where=where), sha256)
