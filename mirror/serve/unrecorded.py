"""A repo as the upstream has it now, held in memory only: what pull-through answers when the ledger cannot
record it (the home's disk is full).

The ledger is where a pulled repo's refs, history and listings normally go before serve answers from them
(pull_through.PullThrough.refresh, then served_repo). When that write fails for want of space, the
upstream's answer is still good: its refs, each head's history and the head's whole listing are asked
again here and kept in PullService's memory for the refs TTL, as the last known refs are kept during a
ledger outage. A file of such a repo is passed through, never fetched into the store (passthrough.py).
A file already stored (by an earlier pull or a stage) is served from the store.
"""

from __future__ import annotations

from frt.resolver.errors import FrtError
from frt.resolver.hub import HubClient
from frt.resolver.resolution import FileEntry

from ..store.home import Home
from ..store.records import sha256_by_git_oid
from .catalog import ServedCommit, ServedRepo
from .pull_through import SHA, served_file


def upstream_repo(home: Home, hub: HubClient, repo_type: str, repo_id: str, revision: str | None) -> ServedRepo | None:
    """The upstream's refs (and `revision`, a commit sha none of them names), each with its history and
    listing; None when it lists no commit. The upstream's errors are raised, as PullThrough.refresh's."""
    refs = hub.refs(repo_id, repo_type)
    heads = list(dict.fromkeys(sorted(set(refs.values()))))
    if revision and SHA.fullmatch(revision) and revision not in heads:
        heads.append(hub.revision_sha(repo_id, revision, repo_type))
    served = ServedRepo(repo_id, repo_type)
    for head in dict.fromkeys(heads):
        history = hub.history(repo_id, head, repo_type)
        served.meta.update({c.sha: (c.date, c.title) for c in history})
        entries = hub.repo_listing(repo_id, head, repo_type)
        date, title = served.meta.get(head, (None, ""))
        commit = served.commits[head] = ServedCommit(head, date, title)
        known = _known_contents(home, entries)
        for e in entries:
            commit.files[e.path] = served_file(e, e.sha256 or known.get(e.git_oid), home.store)
        served.logs[head] = [c.sha for c in history if c.sha in heads] or [head]
    for (kind, name), sha in refs.items():
        if sha in served.commits:
            (served.branches if kind == "branch" else served.tags)[name] = sha
    return served if served.commits else None


def _known_contents(home: Home, entries: list[FileEntry]) -> dict[str, str]:
    """The sha256 the ledger records for the small files' git oids (a read: it works on a full disk);
    none where it cannot be read (then such a file is passed through, as one not stored)."""
    oids = [e.git_oid for e in entries if not e.sha256]
    try:
        return sha256_by_git_oid(home.ledger, oids) if oids else {}
    except FrtError:
        return {}
