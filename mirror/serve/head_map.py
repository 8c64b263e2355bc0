"""`serve --head-map RUN_DIR`: the answers to HEADs of stored files by commit sha, written as an nginx map
for nginx-conf's nginx (`nginx-conf --head-map`), which then answers those HEADs itself.

A node's job start is a HEAD per file by commit sha (kernels, snapshot_download): an immutable URL whose
answer is fixed by the catalog. Each line of RUN_DIR/heads/current.answers is one such URL, exactly as a
client spells it (nginx matches `$request_uri`, so a URL spelled any other way, or with a query, still
goes to a replica), and the URI of serve's answer to it: the blob under the store and what fixes its
headers (the size of an LFS file, whose ETag and X-Linked-Etag are the blob's sha256, or the git oid of
another; the commit). nginx rewrites a plain HEAD to it, and one regex location sends serve's headers
over nginx's own static answer for the blob, whose Content-Length is the file's size: header for header
what serve answers (tests/test_nginx_head_map.py). Only hash lookups and that one regex: a mapped HEAD
costs nginx what its static answer does (bench/serve.py).

Kept current by the catalog's change serial: each poll of the watcher (watch.py) that finds a new
catalog, or a blob this process found bad, rewrites the file (atomically, only when it differs) and
tells nginx to reload it (SIGHUP to RUN_DIR/nginx.pid), so an unstaged file stops being answered by nginx
within a poll and a reload. Left out, and so answered by a replica as before: repos that pull-through
covers (their answers depend on the upstream), every file when a token is needed (nginx cannot check
one), blobs found bad or missing, and URLs nginx's map cannot hold (characters a client would
percent-encode, or longer than KEY_MAX).
"""

from __future__ import annotations

import os
import re
import signal
import sys
import tempfile
from collections.abc import Callable, Collection
from pathlib import Path

from ..store.blobs import blob_relpath
from .catalog import Catalog, ServedFile

KEY_MAX = 200  # nginx-conf sets map_hash_bucket_size 256: a longer key would not fit a bucket
_PLAIN = re.compile(r"[A-Za-z0-9._~/-]+")  # what huggingface_hub's quote() leaves as it is
_ANSWER = re.compile(r"/_frt_heads/(L/[0-9]+|G/[0-9a-f]{40,64})/[0-9a-f]{40}/[0-9a-f]{2}/[0-9a-f]{64}")
PREFIX = {"model": "", "kernel": "/kernels", "dataset": "/datasets", "space": "/spaces"}
# Not *.map: a config nginx-conf wrote before the map's values were answer URIs reads heads/*.map (values
# "blob|ETag|…"); mid-upgrade, either one reading the other's file would answer HEADs wrongly.
MAP_NAME = "current.answers"


def head_lines(catalog: Catalog, bad: Collection[str], skip_repo: Callable[[str], bool]) -> list[str]:
    """The map's lines, sorted (so that an unchanged catalog writes an unchanged file)."""
    lines = []
    for (repo_type, repo_id), repo in catalog.repos.items():
        if repo_type not in PREFIX or skip_repo(repo_id):
            continue
        for sha, c in repo.commits.items():
            for path, f in c.files.items():
                key = f"{PREFIX[repo_type]}/{repo_id}/resolve/{sha}/{path}"
                if f.blob is None or f.sha256 in bad or len(key) > KEY_MAX or not _PLAIN.fullmatch(key):
                    continue
                if not f.blob.exists():
                    continue
                answer = answer_uri(f, sha)
                if _ANSWER.fullmatch(answer):  # else a location of nginx's would not parse it: a replica answers
                    lines.append(f'"{key}" "{answer}";\n')
    return sorted(lines)


def answer_uri(f: ServedFile, sha: str) -> str:
    """Where nginx-conf's nginx finds the answer to a HEAD of `f` at commit `sha`: the blob, and serve's
    headers spelled in the URI its location parses (nginx.py's MAP_LOCATION)."""
    if f.lfs:  # ETag and X-Linked-Etag: the blob's sha256, X-Linked-Size: the file's size
        return f"/_frt_heads/L/{f.size}/{sha}/{blob_relpath(f.sha256)}"
    return f"/_frt_heads/G/{f.oid}/{sha}/{blob_relpath(f.sha256)}"


class HeadMap:
    """Writes RUN_DIR/heads/current.answers from a catalog; `update` is cheap when nothing changed."""

    def __init__(self, run_dir: Path, skip_repo: Callable[[str], bool]):
        self.dir, self.run_dir = run_dir / "heads", run_dir
        self.skip_repo = skip_repo
        self._seen: tuple[Catalog, frozenset[str], bool] | None = None
        self._unsignalled = False

    @property
    def path(self) -> Path:
        return self.dir / MAP_NAME

    def update(self, catalog: Catalog, bad: Collection[str]) -> bool:
        """Rewrite the map if the catalog or the bad blobs changed; whether nginx was told to reload."""
        public = not catalog.tokens  # with tokens, every request carries one for a replica to check
        # The catalog itself, not its id(): a new catalog may reuse a freed one's address.
        seen = (frozenset(bad), public)
        if self._seen is not None and self._seen[0] is catalog and self._seen[1:] == seen:
            return False
        self._seen = (catalog, *seen)
        text = "".join(head_lines(catalog, bad, self.skip_repo)) if public else ""
        try:
            if self.path.read_text() == text:
                return False
        except FileNotFoundError:
            pass
        self.dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".", suffix=".tmp")  # not *.answers: nginx's glob skips it
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(tmp, self.path)
        return self._reload()

    def _reload(self) -> bool:
        """SIGHUP to nginx's master, where it runs: it re-reads its config, this map included."""
        try:
            pid = int((self.run_dir / "nginx.pid").read_text().strip())
            os.kill(pid, signal.SIGHUP)
        except (FileNotFoundError, ValueError, ProcessLookupError):
            return False  # not started yet: it reads the map when it starts
        except PermissionError:
            if not self._unsignalled:  # once: every later change would say the same
                self._unsignalled = True
                print(
                    f"frt-mirror: warning: --head-map: cannot signal nginx ({pid}) to reload "
                    f"{self.path}: run serve as nginx's user, or reload nginx after each change",
                    file=sys.stderr,
                    flush=True,
                )
            return False
        return True
