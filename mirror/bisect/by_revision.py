"""Bisect a kernel drift by pinned revision: binary search over the commits between a good and a
bad one that have a build for the target, running a command against each probed commit.

Exit codes of the command follow `git bisect run`: 0 good, 125 skip, 1-127 otherwise bad;
a timeout is a skip (with a note), and a command killed by a signal counts as bad (a crash).
The range, the search and the running of a command are shared with the performance mode
(by_metric.py), which judges a commit by a figure the command prints instead of its exit code.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from frt.resolver.commit_records import CommitRow
from frt.resolver.core import judge
from frt.resolver.errors import BadInput
from frt.resolver.hub import HubClient
from frt.resolver.ledger import Ledger
from frt.resolver.repo_ids import did_you_mean
from frt.resolver.scan import scan
from frt.resolver.targets import Target

from ..store.home import Home
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

    def to_json(self) -> dict[str, Any]:
        return {
            **{k: v for k, v in self.__dict__.items() if k not in ("steps", "skipped")},
            "skipped": [{"commit": c, "reason": r} for c, r in self.skipped],
            "steps": [s.__dict__ for s in self.steps],
            "runs": len(self.steps),
        }


@dataclass
class Range:
    """What a bisect searches: the two ends (full shas), the commits between that have a build for the
    target (oldest first), those that have none (with what they do have), and each commit's listing."""

    good: str
    bad: str
    candidates: list[str]
    skipped: list[tuple[str, str]]
    meta: dict[str, CommitRow]  # sha -> the commit as the upstream listed it

    def described(self, sha: str) -> tuple[str, str]:
        """(title, ISO date) of a commit as the upstream listed it; empty where it did not."""
        c = self.meta.get(sha)
        return (c.title if c else ""), (c.date.isoformat() if c and c.date else "")


def commit_range(ledger: Ledger, repo: str, good: str, bad: str) -> tuple[str, str, list[str]]:
    """(good sha, bad sha, the commits bad reaches and good does not — git's good..bad — oldest first).

    Which commits each reaches is what the upstream listed as its history; their order is the
    upstream's (by date across merges), so over a merge the search is over that order, not a DAG."""
    with ledger.view() as v:
        g, b = v.commit_for(repo, good), v.commit_for(repo, bad)
        if g is None or b is None:
            missing = good if g is None else bad
            if not v.known(repo) and (near := did_you_mean(repo, v.repos())):
                raise BadInput(f"{repo} is not in the ledger{near}")
            raise BadInput(f"{repo}: revision {missing!r} is not in the ledger (scan it, or pass --refresh)")
        history, before = v.history(repo, b), v.history(repo, g)
    if history is None or before is None:
        missing = bad if history is None else good
        raise BadInput(
            f"{repo}: the upstream's history of {missing} is not recorded: bisect it online once "
            "(without --offline), which asks the upstream for it"
        )
    if g not in history:
        raise BadInput(f"{repo}: --good {good} is not an ancestor of --bad {bad}")
    reached = set(before)
    return g, b, [sha for sha in reversed(history) if sha not in reached]


def plan(
    repo: str, *, good: str, bad: str, target: Target, home: Home, hub: HubClient | None, refresh: bool = False
) -> Range:
    """The range to search, scanning the upstream first when the ledger lacks either end's history."""
    ledger = home.ledger
    if hub is not None:
        with ledger.view() as v:  # a full sha where the ledger knows one: the Hub takes no short ones
            revs = [(v.commit_for(repo, r) if v.known(repo) else None) or r for r in (good, bad)]
            known = all(v.history(repo, r) is not None for r in revs)
        if refresh or not known:  # each end's own history is the upstream's answer for it
            scan(repo, hub=hub, ledger=ledger, extra_revisions=tuple(revs))
    g, b, between = commit_range(ledger, repo, good, bad)
    rng = Range(g, b, [], [], {})
    with ledger.view() as v:
        rng.meta = {c.sha: c for c in v.commits(repo)}
        for sha in between[:-1]:  # bad itself is known bad: it is the answer if nothing earlier is
            decisions = judge(v, repo, sha, target)
            if any(d.accepted for d in decisions):
                rng.candidates.append(sha)
            else:
                has = ", ".join(d.name for d in decisions) or "no build variants"
                rng.skipped.append((sha, f"no build for {target}: has {has}"))
    return rng


def search(n: int, probe: Callable[[int], str]) -> tuple[int | None, list[int]]:
    """Binary search over candidates 0..n-1, the good end before them and the bad end after; `probe(i)`
    answers good, bad or skip. Returns (index of the first bad candidate, n for the bad end itself;
    None when skips leave several suspects) and the suspects (the skipped ones, then the first bad)."""
    lo, hi = -1, n  # candidate lo is good (or the good end), candidate hi bad (or the bad end)
    skipped: set[int] = set()
    while untested := [i for i in range(lo + 1, hi) if i not in skipped]:
        mid = (lo + hi) // 2
        i = min(untested, key=lambda j: (abs(j - mid), j))  # nearest the middle that was not skipped
        verdict = probe(i)
        if verdict == "good":
            lo = i
        elif verdict == "bad":
            hi = i
        else:
            skipped.add(i)
    suspects = list(range(lo + 1, hi))  # every one of them skipped
    return (None, suspects + [hi]) if suspects else (hi, [])


def bisect(
    repo: str,
    *,
    good: str,
    bad: str,
    target: Target,
    cmd: list[str],
    home: Home,
    hub: HubClient | None,
    timeout: float | None = None,
    refresh: bool = False,
    on_step: Callable[[Step], None] = lambda s: None,
) -> BisectResult:
    rng = plan(repo, good=good, bad=bad, target=target, home=home, hub=hub, refresh=refresh)
    result = BisectResult(repo, str(target), rng.good, rng.bad, candidates=rng.candidates, skipped=rng.skipped)
    ends = [*rng.candidates, rng.bad]

    def probe(i: int) -> str:
        step = _run(repo, rng.candidates[i], target, cmd, home, hub, timeout)
        result.steps.append(step)
        on_step(step)
        return step.verdict

    first, suspects = search(len(rng.candidates), probe)
    if first is None:
        result.undecided = [ends[i] for i in suspects]
    else:
        result.first_bad = ends[first]
        result.first_bad_title, result.first_bad_date = rng.described(result.first_bad)
    return result


@dataclass(frozen=True)
class Ran:
    """One run of the command: its exit code (None: killed at the timeout), its time and, when
    captured, its stdout."""

    exit_code: int | None
    seconds: float
    stdout: str = ""


def run_command(cmd: list[str], env: dict[str, str], timeout: float | None, capture: bool = False) -> Ran:
    t0 = time.monotonic()
    try:
        # Its own process group, so a timeout kills the command's children too, not just a shell.
        # Its output goes to stderr: stdout carries only the result (a table or --json); captured, it is
        # relayed there after the run.
        proc = subprocess.Popen(
            cmd,
            env={**os.environ, **env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if capture else sys.stderr.fileno(),
            start_new_session=True,
        )
    except OSError as e:
        raise BadInput(f"cannot run {cmd[0]!r}: {e.strerror}") from None
    try:
        out, _ = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        rc = None
    text = (out or b"").decode(errors="replace")
    if text:
        sys.stderr.write(text)
        sys.stderr.flush()
    return Ran(rc, time.monotonic() - t0, text)


def _run(
    repo: str, sha: str, target: Target, cmd: list[str], home: Home, hub: HubClient | None, timeout: float | None
) -> Step:
    pinned = pin_env(repo, sha, target, home=home, hub=hub, offline=hub is None)
    ran = run_command(cmd, pinned.env, timeout)
    rc = ran.exit_code
    if rc is None:
        return Step(sha, pinned.variant, None, ran.seconds, "skip", f"timed out after {timeout:g} s")
    if rc == 0:
        return Step(sha, pinned.variant, rc, ran.seconds, "good")
    if rc == 125:
        return Step(sha, pinned.variant, rc, ran.seconds, "skip", "the command asked to skip (exit 125)")
    note = f"killed by signal {-rc}: counted as bad" if rc < 0 else ""
    return Step(sha, pinned.variant, rc, ran.seconds, "bad", note)
