"""serve's count of what its kernels clients ask for (the fleet's demand, mirror/serve/demand_records.py).

A kernels client names its system in its User-Agent (`kernels/0.17.2; python/3.11; backend/cu130;
platform/x86_64-linux; file_type/kernel; torch/2.11.0`): that is the target it asks for, with its GPUs'
archs where the node's `frt-mirror env` named them (`; origin/frt-archs:8.0,9.0`: resolver/agent_archs.py).
One load is one listing of a revision's `build/` (kernels' get_variants), answered from what is staged:
counted as served where the target accepts a listed variant (the one kernels picks, by kernels' rules),
else as a miss of the variant. (After a load finds no variant, kernels lists the newest version's `build/` too, by its
ref name, for a hint: that is not counted.) A revision or repo this mirror does not have is a miss too;
so is a version it knows of but has not staged: its refs answer names those versions to kernels clients
(and only to them), so that kernels asks for the commit, gets a 404 that says so, and the ask is
counted, where it would otherwise stop at "Version 2 not found" without a request that names it.

Counting costs a dict update under a lock; the counts go to the ledger from a thread every INTERVAL
seconds and when serve stops (never in a request), so a ledger that is down or a home mounted read-only
costs no request anything: the counts wait in memory, at most MAX_PENDING kinds of request. Storage is
bounded too: a process counts at most MAX_DAILY distinct kinds a day (each a repo x what was asked x
target x outcome); what is past either bound is dropped, and said in serve's log. Other clients
(huggingface_hub alone, a browser) are not counted.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from functools import lru_cache
from typing import TYPE_CHECKING

from frt.manifests.fields import repo_id_problem
from frt.resolver.agent_archs import agent_archs
from frt.resolver.errors import FrtError, LocalDiskError
from frt.resolver.targets import make_target
from frt.resolver.variants import accepted

from .demand_records import SERVED, Ask, Tally

if TYPE_CHECKING:
    from starlette.types import Scope

    from .catalog import ServedRepo

_FULL = ("disk is full", "No space left")  # SQLite's and the OS's words for a full disk
log = logging.getLogger("frt.serve")
INTERVAL = 2.0
MAX_PENDING = 4096  # kinds of request held in memory between two writes (more wait on the ledger's return)
MAX_DAILY = 10_000  # kinds of request one process counts in a UTC day: what a client sends cannot grow the table
_FIELD = re.compile(r"(?:^|;)\s*(kernels|torch|backend|platform)/([^;\s]+)")
_VERSION = re.compile(r"v\d+")


@lru_cache(maxsize=256)
def target_of(agent: str) -> str | None:
    """The target a kernels client's User-Agent names ("" where it names none we know); None: not kernels."""
    fields = dict(_FIELD.findall(agent))
    if "kernels" not in fields:
        return None
    torch = re.match(r"(\d+)\.(\d+)", fields.get("torch", ""))
    cpu, _, os_name = fields.get("platform", "").partition("-")
    try:
        target = make_target(
            torch=f"{torch[1]}.{torch[2]}" if torch else None, backend=fields.get("backend", ""), cpu=cpu, os=os_name
        )
    except (FrtError, ValueError):
        return ""
    return str(agent_archs(target, agent))  # its GPUs where the node's env named them (agent_archs.py)


def _agent(scope: Scope) -> str:
    value: bytes  # the scope's raw (name, value) header pairs
    for name, value in scope["headers"]:
        if name == b"user-agent":
            return value.decode("latin-1")[:1024]
    return ""


class DemandRecorder:
    """The counts of one serve process. `write(tallies)` stores them (record_demand over the home's
    ledger); None: count nothing (a bare app). `clients`: keep each request's client address too."""

    def __init__(self, write: Callable[[dict[Ask, Tally]], None] | None = None, clients: bool = False):
        self.write, self.clients = write, clients
        self._pending: dict[Ask, Tally] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._said: str | None = None  # the last write failure said in the log (said once, until it changes)
        self._day = ""
        self._today: set[Ask] = set()  # the kinds counted this UTC day (MAX_DAILY)
        self.dropped = 0
        # serve --upstream: hands each written batch on to the upstream (demand_rollup.Forwarder)
        self.forward: Callable[[dict[Ask, Tally]], None] | None = None

    # -- what the app calls ------------------------------------------------------------------------

    def unstaged_refs(self, scope: Scope, unstaged: dict[str, str]) -> dict[str, str]:
        """The versions known but not staged, for a kernels client's refs answer (see the module's doc)."""
        return unstaged if unstaged and target_of(_agent(scope)) is not None else {}

    def listed(self, scope: Scope, repo: ServedRepo, rev: str, commit: str, names: list[str]) -> None:
        """A listing of `build/` at a staged commit: served where the client's target accepts a variant."""
        target = self._target(scope)
        if target is None or _probe(rev):
            return
        picks = self._accepted(target, tuple(names)) if target else []
        asked = _asked(repo, commit)
        self._count(scope, Ask(repo.repo_id, asked, target, SERVED if picks else "variant"), picks[0] if picks else "")

    def missed(self, scope: Scope, repo: ServedRepo, rev: str) -> None:
        """A revision the repo does not have staged: a known version's commit, or any other revision."""
        target = self._target(scope)
        if target is None or _probe(rev):
            return
        name = repo.unstaged_version(rev)
        if name is not None:
            self._count(scope, Ask(repo.repo_id, name, target, "version"))
        elif _VERSION.fullmatch(rev):
            self._count(scope, Ask(repo.repo_id, rev, target, "version"))
        else:
            self._count(scope, Ask(repo.repo_id, f"revision {rev[:64]}", target, "revision"))

    def missed_repo(self, scope: Scope, repo_id: str) -> None:
        """A repo this mirror has nothing of (gated: a malformed id is nobody's demand)."""
        target = self._target(scope)
        if target is not None and repo_id_problem(repo_id) is None:
            self._count(scope, Ask(repo_id, "", target, "repo"))

    def add(self, tallies: dict[Ask, Tally]) -> None:
        """Counts a tier below handed on (demand_rollup.py), added to this process's, within MAX_PENDING."""
        if self.write is None:
            return
        with self._lock:
            for ask, t in tallies.items():
                mine = self._pending.get(ask)
                if mine is not None:
                    mine.count, mine.last = mine.count + t.count, max(mine.last, t.last)
                elif len(self._pending) < MAX_PENDING:
                    self._pending[ask] = t
                else:
                    self.dropped += t.count
            self._start()

    # -- counting and writing ------------------------------------------------------------------------

    def _target(self, scope: Scope) -> str | None:
        return None if self.write is None else target_of(_agent(scope))

    @staticmethod
    @lru_cache(maxsize=1024)
    def _accepted(target: str, names: tuple[str, ...]) -> list[str]:
        from frt.resolver.targets import parse_target

        try:
            # by name, as kernels picks: the listing has no variant's declared archs (agent_archs.py)
            return accepted(parse_target(target).by_name, names)
        except FrtError:
            return []

    def _count(self, scope: Scope, ask: Ask, variant: str = "") -> None:
        if self.clients and scope.get("client"):
            ask = Ask(ask.repo, ask.asked, ask.target, ask.outcome, str(scope["client"][0]))
        now = datetime.now(UTC)
        with self._lock:
            if (day := now.date().isoformat()) != self._day:
                self._day, self._today = day, set()
            t = self._pending.get(ask)
            if t is not None:
                t.count, t.last, t.variant = t.count + 1, now, variant or t.variant
            elif len(self._pending) < MAX_PENDING and (ask in self._today or len(self._today) < MAX_DAILY):
                self._today.add(ask)
                self._pending[ask] = Tally(1, now, now, variant)
            else:
                self.dropped += 1
            self._start()

    def _start(self) -> None:
        """Under the lock. At the first count: after any fork (serve --workers builds the app before)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="frt-demand", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            self._wake.wait(INTERVAL)
            self._wake.clear()
            self.flush()

    def flush(self) -> bool:
        """Write what was counted; on failure keep it for the next try (said once in serve's log)."""
        with self._lock:
            pending, self._pending = self._pending, {}
            dropped, self.dropped = self.dropped, 0
        if dropped:
            log.warning(
                "demand: %d request(s) not counted: past %d kinds of request pending or %d in a day",
                dropped,
                MAX_PENDING,
                MAX_DAILY,
            )
        if not pending or self.write is None:
            return True
        try:
            self.write(pending)
        except Exception as e:  # noqa: BLE001  the ledger down, a read-only home: counts must not cost serve
            with self._lock:
                for ask, t in pending.items():
                    mine = self._pending.get(ask)
                    if mine is None:
                        if len(self._pending) < MAX_PENDING:
                            self._pending[ask] = t
                    else:
                        mine.count, mine.first = mine.count + t.count, t.first
            text = _why(e)
            if text != self._said:
                self._said = text
                log.warning("demand: counts not written to the ledger yet (kept in memory): %s", text)
            return False
        self._said = None
        if self.forward is not None:
            try:
                self.forward(pending)  # once: demand is a hint, and the upstream may be the Hub
            except Exception as e:  # noqa: BLE001  an upstream's trouble must not cost this serve
                log.info("demand: not handed to the upstream: %s", f"{type(e).__name__}: {e}"[:300])
        return True


def _why(e: Exception) -> str:
    """Why counts were not written, for serve's log. A full disk is said once by serve's own line
    (disk.py): here it is named without repeating "disk is full" (and the ledger's own wording of it)."""
    text = f"{type(e).__name__}: {e}".splitlines()[0][:300]
    if isinstance(e, LocalDiskError) and any(s in text for s in _FULL):
        return "the home's disk has no room for them now"
    return text


def _probe(rev: str) -> bool:
    """kernels' look at the newest version after a load found no variant (its "consider upgrading"
    hint) lists `build/` at `refs/heads/vN`, where a load asks for the commit: not an ask of its own."""
    return rev.startswith("refs/")


def _asked(repo: ServedRepo, commit: str) -> str:
    """A staged commit as what a client asked for: its version where a v<N> branch names it."""
    names = [n for n, sha in repo.branches.items() if sha == commit and _VERSION.fullmatch(n)]
    return max(names, key=lambda n: int(n[1:])) if names else f"revision {commit}"
