"""Incremental bundles: what a bundle holds, as a state the next bundle is written against, and the
check that an importing home holds a base.

A bundle's *state* is a compact account of everything it and its bases carry: the blobs by sha256,
and per record a fingerprint (a hash of the record's content) under the record's natural key — a
repo's header and refs, each commit (with its build listing), each head's listing, each staged row
(repo, requested, target), each org's publisher answer. `bundle --since PREV` reads PREV's manifest
only: PREV's state is its base's state (which PREV carries) updated with PREV's own records, so a
chain A ← B ← C needs none of the earlier files. The new bundle carries what its state lacks or
holds with another fingerprint, the staged rows the state holds and the home no longer stages (its
removals, `unstaged`: the importer drops them), and the base's state besides, for the importer's check
and the next link of the chain.

An incremental bundle imports only into a home that *holds its base*: every blob of the base's state
recorded and in the store, every repo, commit (with its build listing where the base had one), listed
head, staged row and publisher present. That is a question put to the home's contents, not to its
events log ("was the base imported here?"), because the contents are what the incremental relies on:
the connected box that wrote the base holds it without ever importing it, and so does a home that
imported a full bundle of the same set or more; while a home that imported the base and has since lost
blobs to gc does not hold it any more, whatever its log says. The log still names the base's import, or
its absence, in the refusal, which is what an operator asks next.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any, NotRequired, TypedDict

from frt.resolver.gate import check_commit, check_org, check_repo_id, check_sha256
from frt.resolver.ledger import Ledger
from frt.resolver.ledger.io import repo_record
from frt.resolver.ledger.retry import retried

from ..events import events_with_ref
from ..store.home import Home
from ..store.records import MODEL_TARGET, recorded_blobs, staged_rows

_KEYS = ("blobs", "repos", "staged", "publishers")


class RepoState(TypedDict):
    record: str | None  # the fingerprint of its header and refs
    commits: dict[str, list[str | bool]]  # sha -> [its fingerprint, whether its build listing travelled]
    listings: dict[str, str]  # head -> the fingerprint of its listing


class State(TypedDict):
    """A bundle's state (as a manifest's `base` carries it: JSON)."""

    blobs: list[str]  # sha256, sorted
    repos: dict[str, RepoState]
    staged: dict[str, str]  # staged_key -> the row's fingerprint
    publishers: dict[str, str]  # org -> its answer's fingerprint


class Base(TypedDict):
    """An incremental bundle's base, as its manifest names it (older bundles may lack `name`, `created`)."""

    id: str  # the base bundle's id
    state: State
    name: NotRequired[str | None]
    created: NotRequired[str | None]


def empty_state() -> State:
    return {"blobs": [], "repos": {}, "staged": {}, "publishers": {}}


def _h(obj: object) -> str:
    """A record's fingerprint: change detection between a bundle and its base, never a trust anchor
    (a forged state can only make the importer refuse, or carry what it would have carried anyway)."""
    data = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(data.encode()).hexdigest()[:32]


def _repo_header(r: dict[str, Any]) -> str:
    refs = sorted((x["kind"], x["name"], x["commit"]) for x in r["refs"])
    return _h([r["repo_type"], r["endpoint"], r["scanned_at"], refs])


def _commit(c: dict[str, Any]) -> str:  # format 1's parent links are not part of a commit's content here
    return _h([c["sha"], c["depth"], c["title"], c["date"], c["variants"]])


def staged_key(row: dict[str, Any]) -> str:
    return json.dumps([row["repo"], row["requested"], row["target"]])


def own_state(doc: dict[str, Any]) -> State:
    """The state of the records a manifest itself carries (not its base's)."""
    return {
        "blobs": sorted(b["sha256"] for b in doc["blobs"]),
        "repos": {
            r["repo"]: {
                "record": _repo_header(r),
                "commits": {c["sha"]: [_commit(c), c["variants"] is not None] for c in r["commits"]},
                "listings": {head: _h(shas) for head, shas in r.get("listings", {}).items()},
            }
            for r in doc["repos"]
        },
        "staged": {staged_key(s): _h(s) for s in doc["staged"]},
        "publishers": {p["org"]: _h(p) for p in doc.get("publishers", [])},
    }


def cumulative_state(doc: dict[str, Any]) -> State:
    """Everything a home holds after importing this bundle (and its bases): the base's state, updated."""
    base = doc.get("base")
    out: State = json.loads(json.dumps(base["state"])) if base else empty_state()
    mine = own_state(doc)
    out["blobs"] = sorted(set(out["blobs"]) | set(mine["blobs"]))
    for repo, rs in mine["repos"].items():
        into = out["repos"].setdefault(repo, {"record": None, "commits": {}, "listings": {}})
        into["record"] = rs["record"]
        into["commits"].update(rs["commits"])
        into["listings"].update(rs["listings"])
    out["staged"].update(mine["staged"])
    for key in doc.get("unstaged", []):
        out["staged"].pop(json.dumps(key), None)
    out["publishers"].update(mine["publishers"])
    return out


def without(state: State, unstaged: list[tuple[str, str, str]]) -> State:
    """`state` less the staged rows an incremental bundle on it takes away: what an importing home must
    hold (once imported, it no longer holds those, and a rerun of the import must not be refused)."""
    gone = {json.dumps(list(k)) for k in unstaged}
    return {**state, "staged": {k: v for k, v in state["staged"].items() if k not in gone}}


def unstaged_since(base: State, staged: list[dict[str, Any]], targets: list[str] | None) -> list[list[str]]:
    """The staged rows `base` (a state) holds and the home no longer stages, as [repo, requested,
    target]: an incremental bundle carries them as removals. A bundle of some targets removes only
    rows it would have carried (models travel in every bundle), never another target's."""
    now = {staged_key(s) for s in staged}
    out = []
    for key in sorted(base["staged"]):
        repo, requested, target = json.loads(key)
        if key not in now and (not targets or target in targets or target == MODEL_TARGET):
            out.append([repo, requested, target])
    return out


def delta(full: dict[str, Any], base: State) -> dict[str, Any]:
    """Of a full manifest's records, those `base` (a state) lacks or holds otherwise. A repo that
    appears at all carries its header and all its refs (a few rows), since merging a repo's refs
    replaces them; of its commits and listings, only the new or changed."""
    have = set(base["blobs"])
    out = {
        "blobs": [b for b in full["blobs"] if b["sha256"] not in have],
        "repos": [],
        "staged": [s for s in full["staged"] if base["staged"].get(staged_key(s)) != _h(s)],
        "publishers": [p for p in full["publishers"] if base["publishers"].get(p["org"]) != _h(p)],
    }
    for r in full["repos"]:
        old = base["repos"].get(r["repo"], {"record": None, "commits": {}, "listings": {}})
        commits = [c for c in r["commits"] if old["commits"].get(c["sha"], [None])[0] != _commit(c)]
        listings = {h: shas for h, shas in r["listings"].items() if old["listings"].get(h) != _h(shas)}
        if commits or listings or old["record"] != _repo_header(r):
            out["repos"].append(dict(r, commits=commits, listings=listings))
    return out


def check_state(state: State) -> State:
    """A base's state from a bundle, its shapes checked (its names reach the ledger's queries)."""
    if not isinstance(state, dict) or set(state) != set(_KEYS):
        raise ValueError("bad base state")
    for sha in state["blobs"]:
        check_sha256(sha, where="base state")
    for repo, rs in state["repos"].items():
        check_repo_id(repo, where="base state")
        for sha, (_, scanned) in rs["commits"].items():
            check_commit(sha, where=f"base state of {repo}")
            if type(scanned) is not bool:
                raise ValueError(f"bad base state of {repo}")
        for head in rs["listings"]:
            check_commit(head, where=f"base state of {repo}", what="listed head")
    for key in state["staged"]:
        row = json.loads(key)
        if not (isinstance(row, list) and len(row) == 3 and all(isinstance(x, str) for x in row)):
            raise ValueError(f"bad staged key {key!r} in the base state")
    for org in state["publishers"]:
        check_org(org, where="base state")
    return state


def missing_here(state: State, home: Home) -> list[str]:
    """What of a base's state this home lacks, counted per kind with an example; [] if it holds it."""
    ledger, store = home.ledger, home.store
    recorded = recorded_blobs(ledger, state["blobs"])
    out = _count("blob", [sha for sha in state["blobs"] if sha not in recorded or not store.has(sha)])
    known = _known_repos(ledger, state["repos"])
    out += _count("repo", sorted(set(state["repos"]) - known))
    commits, heads = [], []
    for repo in sorted(known):
        rec, rs = repo_record(ledger, repo), state["repos"][repo]
        here = {c["sha"]: c["variants"] is not None for c in rec["commits"]}
        commits += [
            f"{repo}@{sha[:12]}"
            for sha, (_, scanned) in rs["commits"].items()
            if sha not in here or (scanned and not here[sha])
        ]
        heads += [f"{repo}@{head[:12]}" for head in rs["listings"] if head not in rec["listings"]]
    out += _count("commit", commits) + _count("history listing", heads)
    have = {staged_key(r.__dict__) for r in staged_rows(ledger)}
    out += _count("staged row", [" ".join(json.loads(k)) for k in state["staged"] if k not in have])
    out += _count("publisher", sorted(set(state["publishers"]) - set(ledger.publishers(set(state["publishers"])))))
    return out


@retried
def _known_repos(ledger: Ledger, repos: Iterable[str]) -> set[str]:
    with ledger.view() as v:
        return {repo for repo in repos if v.known(repo)}


def _count(what: str, missing: list[str]) -> list[str]:
    return [f"{len(missing)} {what}(s), e.g. {missing[0]}"] if missing else []


def base_refusal(base: Base, missing: list[str], home: Home) -> str:
    """The one line an import of an incremental bundle says when its home does not hold the base."""
    name = f"{base.get('name') or 'its base'} (id {base['id'][:12]}, written {base.get('created', '?')})"
    imported = events_with_ref(home.ledger, "import", base["id"])
    wrote = events_with_ref(home.ledger, "bundle", base["id"])
    seen = (
        f"it was imported here at {imported[-1].at:%Y-%m-%d %H:%M} but is no longer whole"
        if imported
        else f"this home wrote it at {wrote[-1].at:%Y-%m-%d %H:%M} but has changed since"
        if wrote
        else "it was never imported here"
    )
    return (
        f"an incremental bundle on base {name}, which this home does not hold ({seen}): missing "
        f"{'; '.join(missing)}; import the base first"
    )
