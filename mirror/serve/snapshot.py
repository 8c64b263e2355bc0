"""The catalog's snapshot beside the home: what a replica (re)started while the ledger's server is down
starts from.

A running serve never needs the ledger (watch.py), but one that starts during an outage had nothing to
answer from and exited 3: a supervisor restarting a replica then had no replica until the ledger came
back. So each serve process that loads its catalog from the ledger (at start, and at each reload on a
serial change) writes that catalog here, one file replaced whole (resolver/fs.py's atomic write). Several
replicas on one home write the same content for the same serial; the last writer wins, and a reader sees
one whole file. A write that fails (a read-only mount, a full disk) is one warning line: the snapshot only
matters for a later start during an outage, never for this serve.

The snapshot holds what the catalog answers from and nothing else: files by path (size, git oid, sha256,
whether LFS), refs, commit logs and titles, the publishers' trust as recorded, the wheels, and the bearer
tokens' sha256 exactly as the ledger keeps them (never a token). Blob paths are not kept: they are the
store's to name (`locator`), on whichever host reads it. `serve --trust` is the operator's word for this
run, not the ledger's: applied when read, never written. JSON, compact: json.loads reads it faster than
anything the catalog's own load from the ledger could be replaced by, and an operator can read it.

Read only at a start the ledger does not answer, and only where it holds: the format this code writes, and
every blob it names present in the store at the size it names (each blob's file stat()ed; on an object
store, one listing of the store, which gives sizes too; bytes are never hashed here: serve hashes what it
sends, integrity.py). The serial it came from is said, and the watcher reloads from the ledger at its
first good poll whatever that serial is.

Only a ledger on a database server gets one: a SQLite ledger lives in the home itself, a file no outage
takes away from the host that reads the snapshot beside it.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from frt.resolver.errors import FrtError, StoreUnavailable
from frt.resolver.fs import atomic_write

from ..home_path import HomeLayout
from ..store.home import Home
from ..store.protocol import BlobStore
from .catalog import Catalog, ServedCommit, ServedFile, ServedRepo

FORMAT = 1  # bumped whenever what a snapshot holds changes: a serve reads only its own format


class SnapshotUnusable(FrtError):
    """Why the snapshot cannot be served from: its one line, said after the ledger's."""


@dataclass(frozen=True)
class Snapshot:
    catalog: Catalog
    serial: int  # the ledger's change serial the catalog was loaded at
    loaded: float  # wall time of that load
    path: Path

    def when(self) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.loaded))


class Snapshots:
    """One home's snapshot file. `write` after each load from the ledger; `read` where the ledger does not
    answer at start."""

    def __init__(self, home: Home):
        self.home = home
        self.path = HomeLayout(home.root).catalog_snapshot
        self._failing = False  # a failed write is said once, until one succeeds

    @classmethod
    def of(cls, home: Home) -> Snapshots | None:
        return cls(home) if home.ledger_on_server else None

    def write(self, catalog: Catalog, serial: int, loaded: float | None = None) -> None:
        try:
            doc = encode(catalog, serial, time.time() if loaded is None else loaded, ledger_named(self.home))
            atomic_write(self.path, doc)
        except OSError as e:
            if not self._failing:
                print(
                    f"frt-mirror: warning: cannot write the catalog snapshot {self.path} ({e.strerror or e}): "
                    "a serve started while the ledger is down will not have this catalog to start from",
                    file=sys.stderr,
                    flush=True,
                )
            self._failing = True
        else:
            self._failing = False

    def read(self, trust_override: frozenset[str] = frozenset()) -> Snapshot:
        """The snapshot, checked against the store; SnapshotUnusable saying why not."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            raise SnapshotUnusable(f"no catalog snapshot at {self.path} to start from") from None
        except OSError as e:
            raise SnapshotUnusable(f"cannot read the catalog snapshot {self.path} ({e.strerror or e})") from None
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict) or doc.get("format") != FORMAT:
                got = doc.get("format") if isinstance(doc, dict) else None
                raise SnapshotUnusable(
                    f"the catalog snapshot {self.path} is format {got}; this serve reads format {FORMAT}"
                )
            catalog = decode(doc, self.home.store, trust_override)
            serial, loaded, came_from = int(doc["serial"]), float(doc["loaded"]), doc.get("ledger")
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise SnapshotUnusable(f"{self.path} is not a catalog snapshot ({type(e).__name__}: {e})") from None
        # A snapshot written before it named its ledger is taken as this one's (the home is the same).
        if came_from is not None and came_from != (ours := ledger_named(self.home)):
            raise SnapshotUnusable(
                f"the catalog snapshot {self.path} is of the ledger {came_from}, not this serve's {ours}"
            )
        if (problem := held_by(catalog, self.home.store)) is not None:
            raise SnapshotUnusable(f"the catalog snapshot {self.path} does not match the store: {problem}")
        return Snapshot(catalog, serial, loaded, self.path)


def ledger_named(home: Home) -> str:
    """The ledger a snapshot is of, as its URL reads with the password hidden: a home pointed at another
    database (another site's, one restored elsewhere) must not start from this one's catalog."""
    from sqlalchemy.engine import make_url

    return make_url(home.ledger_url).render_as_string(hide_password=True) if home.ledger_url else "the home's"


def encode(catalog: Catalog, serial: int, loaded: float, ledger: str) -> bytes:
    doc = {
        "format": FORMAT,
        "ledger": ledger,
        "serial": serial,
        "loaded": loaded,
        "repos": [_repo(r) for r in catalog.repos.values()],
        "publishers": catalog.publishers,
        "tokens": sorted(catalog.tokens),
        "wheels": {p: {n: [f.size, f.sha256] for n, f in ws.items()} for p, ws in catalog.wheels.items()},
        "unheld": list(catalog.unheld),
    }
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def _repo(r: ServedRepo) -> dict[str, Any]:
    return {
        "type": r.repo_type,
        "id": r.repo_id,
        "branches": r.branches,
        "tags": r.tags,
        "unstaged": r.unstaged,
        "commits": {
            c.sha: {
                "date": _date(c.date),
                "title": c.title,
                "files": {f.path: [f.size, f.oid, f.sha256, f.lfs] for f in c.files.values()},
            }
            for c in r.commits.values()
        },
        "logs": r.logs,
        "meta": {sha: [_date(date), title] for sha, (date, title) in r.meta.items()},
    }


def decode(doc: dict[str, Any], store: BlobStore, trust_override: frozenset[str]) -> Catalog:
    """The catalog a snapshot holds, its blobs named by `store` as load_catalog names them."""
    repos: dict[tuple[str, str], ServedRepo] = {}
    for r in doc["repos"]:
        served = repos[(r["type"], r["id"])] = ServedRepo(
            r["id"], r["type"], dict(r["branches"]), dict(r["tags"]), unstaged=dict(r["unstaged"])
        )
        for sha, c in r["commits"].items():
            commit = served.commits[sha] = ServedCommit(sha, _datetime(c["date"]), c["title"])
            for path, (size, oid, content, lfs) in c["files"].items():
                commit.files[path] = ServedFile(path, int(size), oid, content, bool(lfs), store.locator(content))
        served.logs = {sha: list(history) for sha, history in r["logs"].items()}
        served.meta = {sha: (_datetime(date), title) for sha, (date, title) in r["meta"].items()}
    wheels = {
        project: {
            name: ServedFile(name, int(size), "", sha, True, store.locator(sha)) for name, (size, sha) in ws.items()
        }
        for project, ws in doc["wheels"].items()
    }
    missing, needed = doc["unheld"]
    publishers = {str(org): bool(trusted) for org, trusted in doc["publishers"].items()}
    return Catalog(repos, publishers, trust_override, frozenset(doc["tokens"]), wheels, (int(missing), int(needed)))


def held_by(catalog: Catalog, store: BlobStore) -> str | None:
    """What of the catalog the store does not hold as the catalog says (None: all of it): every blob named,
    at its size. Files: one stat() each. An object store: one listing (its sizes), nothing per blob."""
    want: dict[str, tuple[int, str]] = {}  # sha256 -> (size, which file names it, for the message)
    for repo in catalog.repos.values():
        for commit in repo.commits.values():
            for f in commit.files.values():
                want.setdefault(f.sha256, (f.size, f"{repo.repo_id}@{commit.sha[:12]} {f.path}"))
    for project, ws in catalog.wheels.items():
        for name, f in ws.items():
            want.setdefault(f.sha256, (f.size, f"{project}'s wheel {name}"))
    if store.files is None:
        try:
            sizes: dict[str, int] = {sha: size for sha, size, _ in store.blob_stats()}
        except StoreUnavailable as e:
            return f"the object store does not answer either ({e})"
    else:
        sizes = {}
        for sha in want:
            try:
                st = os.stat(store.locator(sha))
            except OSError:  # gone, or unreadable here: not held as far as serving goes
                continue
            if stat.S_ISREG(st.st_mode):
                sizes[sha] = st.st_size
    for sha, (size, what) in want.items():
        have = sizes.get(sha)
        if have is None:
            return f"{what} (blob {sha[:12]}) is not in the store {store.where}"
        if have != size:
            return f"{what} (blob {sha[:12]}) is {have} bytes in the store {store.where}, {size} in the snapshot"
    return None


def _date(d: datetime | None) -> str | None:
    return d.isoformat() if d is not None else None


def _datetime(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text is not None else None
