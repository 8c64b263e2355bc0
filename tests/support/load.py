"""Load through a front: many keep-alive clients asking HEAD then GET of files, every answer checked
(status, X-Repo-Commit, ETag, length, the body's sha256); a kill at half-way. What the fault tests count:
failed requests and wrong bytes, where the number to reach is zero."""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class File:
    url: str
    commit: str
    etag: str
    size: int
    sha256: str
    repo: str = ""
    path: str = ""


def hub_files(hub, rows: list[dict]) -> list[File]:
    """Every file of the staged rows (stage --json's: repo, commit, variant), as a client asks for it (by
    commit), with what it must get back: the fake Hub's own bytes and headers."""
    return files_of(lambda repo_id: hub.repos[("kernel", repo_id)], rows)


def files_of(repo_of, rows: list[dict]) -> list[File]:
    """hub_files, with each row's FakeRepo from `repo_of(repo_id)`."""
    out = {}
    for row in rows:
        repo = repo_of(row["repo"])
        commit = repo.commits[row["commit"]]
        for path, data in commit.files.items():
            if data is not None and path.startswith(f"build/{row['variant']}/"):
                meta = commit.meta[path]
                etag = meta.sha256 if (len(data) >= 64 << 10 and meta.sha256) else meta.oid
                out[(row["repo"], commit.sha, path)] = File(
                    f"/kernels/{row['repo']}/resolve/{commit.sha}/{path}",
                    commit.sha,
                    f'"{etag}"',
                    len(data),
                    hashlib.sha256(data).hexdigest(),
                    row["repo"],
                    path,
                )
    return list(out.values())


class Client:
    """One keep-alive connection doing HEAD then GET of files, checking every answer; it reconnects
    only when nginx says `Connection: close`. Anything else that goes wrong is a failed request."""

    def __init__(self, port: int, failures: list):
        self.port, self.failures, self.conn, self.done = port, failures, None, 0

    async def ask(self, method: str, f: File) -> None:
        try:
            if self.conn is None:
                self.conn = await asyncio.open_connection("127.0.0.1", self.port)
            reader, writer = self.conn
            writer.write(f"{method} {f.url} HTTP/1.1\r\nHost: mirror\r\n\r\n".encode())
            head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 120)).decode("latin-1")
            status, *lines = head.rstrip().split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines)}
            n = int(headers.get("content-length", "-1"))
            body = await asyncio.wait_for(reader.readexactly(n), 120) if method == "GET" and n > 0 else b""
            got = (status.split()[1], headers.get("x-repo-commit"), headers.get("etag"), n)
            if got != ("200", f.commit, f.etag, f.size):
                self.failures.append((method, f.url, got))
            elif method == "GET" and hashlib.sha256(body).hexdigest() != f.sha256:
                self.failures.append((method, f.url, "wrong bytes"))
            if headers.get("connection") == "close":
                self.close()
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError, IndexError) as e:
            self.failures.append((method, f.url, repr(e)))
            self.close()
        self.done += 1

    def close(self) -> None:
        if self.conn is not None:
            self.conn[1].close()
            self.conn = None


async def load(port: int, files: list[File], clients: int, rounds: int, kill, until=None) -> dict:
    """`clients` clients, each asking HEAD + GET of every file `rounds` times (in its own order); `kill()`
    once half of those requests are answered (it must not block: the clients share its event loop). With
    `until`, each client goes on round after round, past `rounds`, until `until()` is true (a fault that
    takes a while: traffic goes on through all of it). Returns the failures, the requests answered and
    those after the kill."""
    failures: list = []
    pool = [Client(port, failures) for _ in range(clients)]
    total = clients * rounds * len(files) * 2
    state = {"after": None}

    async def run(i: int, c: Client) -> None:
        r = 0
        while r < rounds or (until is not None and not until()):
            for j in range(len(files)):
                f = files[(i + r + j) % len(files)]
                await c.ask("HEAD", f)
                await c.ask("GET", f)
            r += 1
        c.close()

    async def killer() -> None:
        while sum(c.done for c in pool) < total // 2:
            await asyncio.sleep(0.005)
        state["at"] = sum(c.done for c in pool)
        kill()

    k = asyncio.ensure_future(killer())
    await asyncio.gather(*(run(i, c) for i, c in enumerate(pool)))
    await k
    done = sum(c.done for c in pool)
    return {"failures": failures, "total": done, "after": done - state["at"]}
