"""Bisect a kernel drift by pinned revision: binary search over the commits between a good and a
bad one that have a build for the target, running a command against each probed commit.

Exit codes of the command follow `git bisect run`: 0 good, 125 skip, 1-127 otherwise bad;
a timeout is a skip (with a note), and a command killed by a signal counts as bad (a crash).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from frt.resolver import HubClient, Ledger, Target, decide, scan
from frt.resolver.errors import BadInput

from .home import Home
from .pin import pin_env


@dataclass(frozen=True)
class Step:
    commit: str
    variant: str
    exit_code: int | None  # None: timed out
    seconds: float
    verdict: str  # good | bad | skip
    note: str = ""


@dataclass
class BisectResult:
    repo: str
    target: str
    good: str
    bad: str
    first_bad: str | None = None
    first_bad_title: str = ""
    first_bad_date: str = ""
    candidates: list[str] = field(default_factory=list)  # tested in range: oldest first
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (commit, why) without the target's variant
    steps: list[Step] = field(default_factory=list)
    undecided: list[str] = field(default_factory=list)  # when skips leave several suspects

    def to_json(self) -> dict:
        return {**{k: v for k, v in self.__dict__.items() if k not in ("steps", "skipped")},
                "skipped": [{"commit": c, "reason": r} for c, r in self.skipped],
                "steps": [s.__dict__ for s in self.steps], "runs": len(self.steps)}


def commit_range(ledger: Ledger, repo: str, good: str, bad: str) -> tuple[str, str, list[str]]:
    """(good sha, bad sha, the commits bad reaches and good does not — git's good..bad — oldest first).

    Which commits each reaches is what the upstream listed as its history; their order is the
    upstream's (by date across merges), so over a merge the search is over that order, not a DAG."""
    with ledger.view() as v:
        g, b = v.commit_for(repo, good), v.commit_for(repo, bad)
        if g is None or b is None:
            missing = good if g is None else bad
            raise BadInput(f"{repo}: revision {missing!r} is not in the ledger (scan it, or pass --refresh)")
        history, before = v.history(repo, b), v.history(repo, g)
    if history is None or before is None:
        missing = bad if history is None else good
        raise BadInput(f"{repo}: the upstream's history of {missing} is not recorded: bisect it online once "
                       "(without --offline), which asks the upstream for it")
    if g not in history:
        raise BadInput(f"{repo}: --good {good} is not an ancestor of --bad {bad}")
    reached = set(before)
    return g, b, [sha for sha in reversed(history) if sha not in reached]


def bisect(repo: str, *, good: str, bad: str, target: Target, cmd: list[str], home: Home,
           hub: HubClient | None, timeout: float | None = None, refresh: bool = False,
           on_step: Callable[[Step], None] = lambda s: None) -> BisectResult:
    ledger = home.ledger
    if hub is not None:
        with ledger.view() as v:  # a full sha where the ledger knows one: the Hub takes no short ones
            revs = [(v.commit_for(repo, r) if v.known(repo) else None) or r for r in (good, bad)]
            known = all(v.history(repo, r) is not None for r in revs)
        if refresh or not known:  # each end's own history is the upstream's answer for it
            scan(repo, hub=hub, ledger=ledger, extra_revisions=tuple(revs))
    g, b, between = commit_range(ledger, repo, good, bad)
    result = BisectResult(repo, str(target), g, b)
    with ledger.view() as v:
        meta = {c.sha: c for c in v.commits(repo)}
        for sha in between[:-1]:  # bad itself is known bad: it is the answer if nothing earlier is
            decisions = decide(target, v.variant_names(repo, sha) or ())
            if any(d.accepted for d in decisions):
                result.candidates.append(sha)
            else:
                result.skipped.append((sha, f"no build for {target}: has "
                                            f"{', '.join(d.name for d in decisions) or 'no build variants'}"))
    lo, hi = -1, len(result.candidates)  # candidates[lo] is good (or `good`), candidates[hi] bad (or `bad`)
    skipped_runs: set[int] = set()
    while True:
        untested = [i for i in range(lo + 1, hi) if i not in skipped_runs]
        if not untested:
            break
        mid = (lo + hi) // 2
        probe = min(untested, key=lambda i: (abs(i - mid), i))
        step = _run(repo, result.candidates[probe], target, cmd, home, hub, timeout)
        result.steps.append(step)
        on_step(step)
        if step.verdict == "good":
            lo = probe
        elif step.verdict == "bad":
            hi = probe
        else:
            skipped_runs.add(probe)
    first_bad = result.candidates[hi] if hi < len(result.candidates) else b
    suspects = [result.candidates[i] for i in range(lo + 1, hi)]  # all skipped at run time
    if suspects:
        result.undecided = suspects + [first_bad]
    else:
        result.first_bad = first_bad
        c = meta.get(first_bad)
        result.first_bad_title = c.title if c else ""
        result.first_bad_date = c.date.isoformat() if c and c.date else ""
    return result


def _run(repo, sha, target, cmd, home, hub, timeout) -> Step:
    pinned = pin_env(repo, sha, target, home=home, hub=hub, offline=hub is None)
    env = {**os.environ, **pinned.env}
    t0 = time.monotonic()
    try:
        # Its own process group, so a timeout kills the command's children too, not just a shell.
        # Its output goes to stderr: stdout carries only the result (a table or --json).
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=sys.stderr.fileno(),
                                start_new_session=True)
    except OSError as e:
        raise BadInput(f"cannot run {cmd[0]!r}: {e.strerror}") from None
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return Step(sha, pinned.variant, None, time.monotonic() - t0, "skip", f"timed out after {timeout:g} s")
    seconds, rc = time.monotonic() - t0, proc.returncode
    if rc == 0:
        return Step(sha, pinned.variant, rc, seconds, "good")
    if rc == 125:
        return Step(sha, pinned.variant, rc, seconds, "skip", "the command asked to skip (exit 125)")
    note = f"killed by signal {-rc}: counted as bad" if rc < 0 else ""
    return Step(sha, pinned.variant, rc, seconds, "bad", note)
