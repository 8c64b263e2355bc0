"""A thin client of the upstream Hub (or of another frt-mirror) over `huggingface_hub.HfApi`: refs,
history, listings, small files, each org's trust. File bodies are `frt.mirror.transport`'s.

Why our own retry: `huggingface_hub` (1.x and 2.x) does not retry a 503 or a refused
connection on plain API calls such as `list_repo_refs`, and a stager on a flaky link
must. Failures after the last attempt become one `UpstreamUnavailable` line.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import quote, urlsplit

from huggingface_hub import HfApi, get_session, hf_hub_url
from huggingface_hub.errors import (
    EntryNotFoundError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import RepoFile
from huggingface_hub.utils import build_hf_headers, hf_raise_for_status

from .errors import BadInput, FrtError, UpstreamUnavailable, first_line
from .gate import check_commit, check_git_oid, check_path, check_ref, check_sha256, check_variant
from .pacing import Pacer
from .settings import env_number
from .resolution import CommitInfo, FileEntry

try:  # huggingface_hub 2.x speaks httpx2, 1.x httpx; both name their transport errors alike.
    import httpx2 as _httpx
except ImportError:  # pragma: no cover - exercised in the 1.x environment
    import httpx as _httpx

DEFAULT_ENDPOINT = "https://huggingface.co"
RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
T = TypeVar("T")


class RepoNotFound(BadInput):
    """Upstream says the repository does not exist (or is not visible to us)."""


class RevisionNotFound(BadInput):
    """Upstream has the repository but not that revision."""


@dataclass(frozen=True)
class RetryPolicy:
    """`refused`: whether a refused (or unresolvable) connection is retried. A stager on a flaky link
    retries it; serve's pull-through does not: its client is waiting, and a refused upstream is
    unavailable now, not slow (retrying spent the whole --upstream-timeout and read as a timeout)."""

    attempts: int = 5
    base_wait: float = 0.5
    max_wait: float = 8.0
    refused: bool = True

    def sleep(self, attempt: int) -> None:
        """Exponential backoff with jitter, so stagers sharing a link do not retry in lockstep."""
        wait = min(self.max_wait, self.base_wait * 2 ** (attempt - 1))
        time.sleep(wait * (0.5 + random.random() / 2))

    @classmethod
    def from_env(cls, refused: bool = True) -> RetryPolicy:
        """FRT_RETRY_ATTEMPTS / FRT_RETRY_BASE_WAIT let tests and impatient users shorten it."""
        return cls(attempts=max(1, int(env_number("FRT_RETRY_ATTEMPTS", cls.attempts, int))),
                   base_wait=env_number("FRT_RETRY_BASE_WAIT", cls.base_wait, float), refused=refused)


def resolve_endpoint(endpoint: str | None, option: str = "--endpoint") -> str:
    """The upstream's URL, checked here: a malformed one is bad input at once, not seconds of retries.
    `option`: the option that gave `endpoint`, named in the error."""
    url = (endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        where = option if endpoint else "HF_ENDPOINT"
        raise BadInput(f"{where} {url!r} is not an upstream URL: expected http(s)://host[:port], "
                       "e.g. https://huggingface.co or http://mirror:8470")
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
    def __init__(self, endpoint: str | None = None, *, token: str | None = None, retry: RetryPolicy | None = None,
                 pacer: Pacer | None = None):
        ask_only_our_endpoint()
        self.endpoint = resolve_endpoint(endpoint)
        self.api = HfApi(endpoint=self.endpoint, token=token)
        self.token = token
        self.retry = retry or RetryPolicy.from_env()
        self._publishers: dict[str, bool | None] = {}
        self.pacer = pacer or Pacer()  # shared by every thread of a run, API calls and file transfers alike

    def refs(self, repo_id: str, repo_type: str = "kernel") -> dict[tuple[str, str], str]:
        r = self._call(lambda: self.api.list_repo_refs(repo_id, repo_type=repo_type), repo_id)
        where = f"upstream refs of {repo_id}"
        out = {}
        # A name becomes refs/<name> in an exported cache, a commit a folder of views and snapshots.
        for kind, refs in (("branch", r.branches), ("tag", r.tags)):
            for ref in refs:
                name = check_ref(ref.name, where=where, what=f"{kind} name")
                what = f"{kind} {name!r} target"
                out[(kind, name)] = check_commit(ref.target_commit, where=where, what=what)
        return out

    def publisher_trusted(self, org: str) -> bool | None:
        """The upstream's `trustedKernelPublisher` for an org; None when the upstream has no
        overview for it (a user namespace, or a Hub without the route)."""
        if org in self._publishers:
            return self._publishers[org]

        def overview() -> bool | None:
            # Not HfApi.get_organization_overview: huggingface_hub 1.x sends it to the global
            # endpoint, whatever HfApi(endpoint=...) says. The same route and JSON key kernels reads.
            r = get_session().get(f"{self.endpoint}/api/organizations/{quote(org, safe='')}/overview",
                                  headers=build_hf_headers(token=self.token))
            if r.status_code in (401, 404):
                return None
            hf_raise_for_status(r)
            doc = r.json()
            return doc.get("trustedKernelPublisher") is True if isinstance(doc, dict) else False

        trusted = self._call(overview, org)
        self._publishers[org] = trusted  # once per run: every repo of an org asks the same question
        return trusted

    def revision_sha(self, repo_id: str, revision: str, repo_type: str = "kernel") -> str:
        info = self._call(lambda: self.api.repo_info(repo_id, revision=revision, repo_type=repo_type), repo_id)
        return check_commit(info.sha, where=f"upstream info of {repo_id}@{revision}")

    def history(self, repo_id: str, revision: str, repo_type: str = "kernel") -> list[CommitInfo]:
        """What the upstream lists as `revision`'s history, newest first, in its order (by date across
        merges; the Hub names no parents, so none is claimed)."""
        commits = self._call(
            lambda: self.api.list_repo_commits(repo_id, revision=revision, repo_type=repo_type), repo_id
        )
        for c in commits:
            check_commit(c.commit_id, where=f"upstream history of {repo_id}@{revision[:12]}")
        return [CommitInfo(c.commit_id, c.created_at.replace(tzinfo=None) if c.created_at else None, c.title or "")
                for c in commits]

    def build_listing(self, repo_id: str, sha: str, repo_type: str = "kernel") -> dict[str, list[FileEntry]]:
        """Every file under build/ at a commit, grouped by variant directory; {} without build/."""

        def listing():
            return list(self.api.list_repo_tree(repo_id, path_in_repo="build", recursive=True, revision=sha,
                                                repo_type=repo_type))

        try:
            entries = self._call(listing, repo_id)
        except _EntryMissing:
            return {}
        where = f"upstream listing of {repo_id}@{sha[:12]}"
        variants: dict[str, list[FileEntry]] = {}
        for e in entries:
            # Asked for build/ only: anything else, or anything climbing out, is a hostile answer.
            parts = check_path(e.path, where=where, under="build/").split("/")
            if isinstance(e, RepoFile) and len(parts) == 2:
                continue  # a file beside the variant dirs (build/README) is no variant
            bucket = variants.setdefault(check_variant(parts[1], where=where), [])
            if isinstance(e, RepoFile):
                bucket.append(_file_entry(e, where))
        return variants

    def repo_listing(self, repo_id: str, sha: str, repo_type: str = "model") -> list[FileEntry]:
        """Every file of a repo at a commit (a model repo: no build/ layout to group by)."""
        entries = self._call(lambda: list(self.api.list_repo_tree(repo_id, recursive=True, revision=sha,
                                                                  repo_type=repo_type)), repo_id)
        where = f"upstream listing of {repo_id}@{sha[:12]}"
        return [_file_entry(e, where) for e in entries if isinstance(e, RepoFile) and check_path(e.path, where=where)]

    def fetch_small_file(self, repo_id: str, path: str, revision: str, repo_type: str = "kernel") -> bytes:
        """GET a small file (metadata.json) into memory; never touches a Hub cache."""
        url = hf_hub_url(repo_id, path, repo_type=repo_type, revision=revision, endpoint=self.endpoint)

        def get():
            r = get_session().get(url, headers=build_hf_headers(token=self.token), follow_redirects=True)
            hf_raise_for_status(r)
            return r.content

        return self._call(get, repo_id, bucket="resolvers")

    def file_url(self, repo_id: str, path: str, revision: str, repo_type: str = "kernel") -> str:
        return hf_hub_url(repo_id, path, repo_type=repo_type, revision=revision, endpoint=self.endpoint)

    def _call(self, fn: Callable[[], T], repo_id: str, bucket: str = "api") -> T:
        """Run one upstream call with retries and rate-limit pacing; map the Hub's errors to ours."""
        attempt = 0
        while True:
            attempt += 1
            self.pacer.wait(bucket)
            try:
                return fn()
            except RepositoryNotFoundError as e:
                raise RepoNotFound(f"{repo_id}: repository not found at {self.endpoint} ({first_line(e)})") from None
            except RevisionNotFoundError as e:
                raise RevisionNotFound(f"{repo_id}: {first_line(e)}") from None
            except EntryNotFoundError:
                raise _EntryMissing() from None
            except OfflineModeIsEnabled:
                raise UpstreamUnavailable(
                    "HF_HUB_OFFLINE is set, so upstream cannot be asked; use --offline to answer from the ledger"
                ) from None
            except (HfHubHTTPError, _httpx.TransportError, ConnectionError, TimeoutError) as e:
                if rate_limited(e):  # a wait, not a failed attempt
                    self.pacer.hold(e.response.headers, bucket, repo_id)
                    attempt -= 1
                    continue
                if not is_transient(e) or (not self.retry.refused and isinstance(e, _httpx.ConnectError)):
                    raise UpstreamUnavailable(f"upstream {self.endpoint} refused: {first_line(e)}") from None
                if attempt >= self.retry.attempts:
                    raise UpstreamUnavailable(
                        f"upstream {self.endpoint} unreachable after {attempt} attempts: {first_line(e)}"
                    ) from None
                self.retry.sleep(attempt)


def rate_limited(e: BaseException) -> bool:
    return isinstance(e, HfHubHTTPError) and getattr(e.response, "status_code", None) == 429


def is_transient(e: BaseException) -> bool:
    """Worth retrying: a dropped or refused connection, a timeout, 408/429/5xx."""
    if isinstance(e, HfHubHTTPError):
        return getattr(e.response, "status_code", None) in RETRY_STATUS
    return isinstance(e, (_httpx.TransportError, ConnectionError, TimeoutError))


class _EntryMissing(FrtError):
    pass


def _file_entry(e: RepoFile, where: str) -> FileEntry:
    """A listed file, its hashes checked too: they name blobs in the store and in exported caches."""
    sha256 = check_sha256(e.lfs.sha256, where=where) if e.lfs else None
    return FileEntry(e.path, e.size, check_git_oid(e.blob_id, where=where), sha256)
