"""Bisect a performance drift: each probed commit runs the command several times and is judged by the
figure it prints (a time, a rate), not by its exit code.

A single timing per commit on a busy machine sends a bisect the wrong way, so every verdict is taken
from a median and guarded by the runs' spread: a commit whose runs scatter (median absolute deviation,
relative to the median) wider than the threshold cannot show an effect of that size, and is skipped
with that reason rather than guessed. The good end's median is the baseline; with `interleave` each
commit's runs alternate with runs of the good commit, and the commit is compared with the good runs
taken alongside it, so a machine that slows down (or speeds up) during the bisect moves both alike.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from frt.resolver.hub import HubClient
from frt.resolver.targets import Target

from ..store.home import Home
from .by_revision import Range, plan, run_command, search
from .pin import PinnedEnv, pin_env


@dataclass(frozen=True)
class Metric:
    """How a run's output becomes a figure, and how figures are judged."""

    pattern: re.Pattern[str]
    higher_is_better: bool = False
    repeat: int = 5
    threshold: float = 5.0  # percent
    interleave: bool = False

    @property
    def direction(self) -> str:
        return "higher is better" if self.higher_is_better else "lower is better"

    def read(self, stdout: str) -> float | str:
        """The figure in a run's stdout (the first match: its group `value`, else its first group, else
        the whole match), or why there is none."""
        m = self.pattern.search(stdout)
        if m is None:
            last = stdout.strip().splitlines()[-1:] or ["(no output)"]
            return f"no match for {self.pattern.pattern!r} in its output (last line: {last[0][:80]!r})"
        text = m.group("value") if "value" in self.pattern.groupindex else m.group(1) if m.re.groups else m.group(0)
        try:
            return float(text)
        except (TypeError, ValueError):
            return f"{self.pattern.pattern!r} matched {text!r}, which is not a number"

    def worse_by(self, value: float, base: float) -> float:
        """How much worse `value` is than `base`, in percent of `base` (negative: better)."""
        if base == 0:
            return 0.0 if value == base else float("inf")
        change = (value - base) / abs(base) * 100
        return -change if self.higher_is_better else change


@dataclass(frozen=True)
class Sample:
    """The figures of one commit's runs, or why they stopped."""

    runs: tuple[float, ...] = ()
    failure: str = ""

    @property
    def median(self) -> float | None:
        return statistics.median(self.runs) if self.runs and not self.failure else None

    @property
    def spread(self) -> float | None:
        """Median absolute deviation relative to the median, in percent."""
        m = self.median
        if m is None:
            return None
        mad = statistics.median(abs(x - m) for x in self.runs)
        return 0.0 if mad == 0 else float("inf") if m == 0 else mad / abs(m) * 100


@dataclass(frozen=True)
class PerfStep:
    """One measured commit and the decision taken from it."""

    commit: str
    variant: str
    role: str  # good end | bad end | probe
    runs: list[float]
    median: float | None
    spread: float | None  # MAD / median, percent
    verdict: str  # good | bad | skip
    reason: str
    baseline: float | None = None  # the good median it was compared with
    change: float | None = None  # percent worse than the baseline (negative: better)
    baseline_runs: list[float] = field(default_factory=list)  # the good runs taken alongside (interleave)


@dataclass
class PerfResult:
    repo: str
    target: str
    good: str
    bad: str
    metric: str
    direction: str
    threshold: float
    repeat: int
    interleave: bool
    good_median: float | None = None
    bad_median: float | None = None
    change: float | None = None  # the bad end against the good end, percent worse
    stopped: str = ""  # why no search was made: no drift between the ends, or an end not measurable
    first_bad: str | None = None
    first_bad_title: str = ""
    first_bad_date: str = ""
    candidates: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    steps: list[PerfStep] = field(default_factory=list)
    undecided: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            **{k: v for k, v in self.__dict__.items() if k not in ("steps", "skipped")},
            "skipped": [{"commit": c, "reason": r} for c, r in self.skipped],
            "steps": [s.__dict__ for s in self.steps],
            "runs": sum(len(s.runs) + len(s.baseline_runs) for s in self.steps),
        }


class _Probe:
    """Runs the command against pinned commits, each pin staged once, and reads each run's figure."""

    def __init__(
        self,
        repo: str,
        target: Target,
        cmd: list[str],
        metric: Metric,
        home: Home,
        hub: HubClient | None,
        timeout: float | None,
    ):
        self.repo, self.target, self.cmd, self.metric = repo, target, cmd, metric
        self.home, self.hub, self.timeout = home, hub, timeout
        self._pins: dict[str, PinnedEnv] = {}

    def pinned(self, sha: str) -> PinnedEnv:
        if sha not in self._pins:
            self._pins[sha] = pin_env(
                self.repo, sha, self.target, home=self.home, hub=self.hub, offline=self.hub is None
            )
        return self._pins[sha]

    def once(self, sha: str) -> float | str:
        ran = run_command(self.cmd, self.pinned(sha).env, self.timeout, capture=True)
        if ran.exit_code is None:
            return f"a run timed out after {self.timeout:g} s"
        if ran.exit_code == 125:
            return "the command asked to skip (exit 125)"
        if ran.exit_code != 0:
            how = f"was killed by signal {-ran.exit_code}" if ran.exit_code < 0 else f"exited {ran.exit_code}"
            return f"a run {how}"
        return self.metric.read(ran.stdout)

    def measure(self, *shas: str) -> list[Sample]:
        """`repeat` runs of each commit; with interleave their runs alternate (a, b, a, b, ...), else
        each commit's runs come together. A commit's first failed run ends every sample: runs taken
        alongside one another are compared as a set."""
        n = self.metric.repeat
        order = (
            [i for _ in range(n) for i in range(len(shas))]
            if self.metric.interleave
            else [i for i in range(len(shas)) for _ in range(n)]
        )
        runs: list[list[float]] = [[] for _ in shas]
        for i in order:
            if isinstance(got := self.once(shas[i]), str):
                return [Sample(tuple(r), got if j == i else "") for j, r in enumerate(runs)]
            runs[i].append(got)
        return [Sample(tuple(r)) for r in runs]


def judge(metric: Metric, sample: Sample, base: Sample, *, alongside: bool) -> tuple[str, str, float | None]:
    """(verdict, reason, percent worse) of a commit's sample against the good commit's."""
    whose = "the good commit's runs alongside" if alongside else "the good end's runs"
    if sample.failure or base.failure:
        return "skip", sample.failure or f"{whose}: {base.failure}", None
    for who, s in (("its runs", sample), (whose, base)):
        assert s.spread is not None  # neither failed: both have runs (at least one each)
        if s.spread > metric.threshold:
            return (
                "skip",
                (
                    f"{who} spread {s.spread:.1f}% (MAD) > the {metric.threshold:g}% threshold: "
                    "too noisy to show the effect (more --repeat, or a quieter machine)"
                ),
                None,
            )
    assert sample.median is not None and base.median is not None  # as their spreads
    change = metric.worse_by(sample.median, base.median)
    if change > metric.threshold:
        return "bad", f"{change:.1f}% worse than the good median {base.median:g}", change
    return "good", f"{change:+.1f}% against the good median {base.median:g}: within {metric.threshold:g}%", change


def _step(
    sha: str,
    variant: str,
    role: str,
    sample: Sample,
    verdict: str,
    reason: str,
    base: Sample | None = None,
    change: float | None = None,
    alongside: bool = False,
) -> PerfStep:
    return PerfStep(
        sha,
        variant,
        role,
        list(sample.runs),
        sample.median,
        sample.spread,
        verdict,
        reason,
        base.median if base else None,
        change,
        list(base.runs) if base and alongside else [],
    )


def bisect_metric(
    repo: str,
    *,
    good: str,
    bad: str,
    target: Target,
    cmd: list[str],
    metric: Metric,
    home: Home,
    hub: HubClient | None,
    timeout: float | None = None,
    refresh: bool = False,
    on_step: Callable[[PerfStep], None] = lambda s: None,
) -> PerfResult:
    rng = plan(repo, good=good, bad=bad, target=target, home=home, hub=hub, refresh=refresh)
    result = PerfResult(
        repo,
        str(target),
        rng.good,
        rng.bad,
        metric.pattern.pattern,
        metric.direction,
        metric.threshold,
        metric.repeat,
        metric.interleave,
        candidates=rng.candidates,
        skipped=rng.skipped,
    )
    probe = _Probe(repo, target, cmd, metric, home, hub, timeout)

    def record(step: PerfStep) -> PerfStep:
        result.steps.append(step)
        on_step(step)
        return step

    good_sample = _ends(result, rng, probe, record)
    if result.stopped:
        return result

    def judged(i: int) -> str:
        sha = rng.candidates[i]
        sample, base = probe.measure(sha, rng.good) if metric.interleave else (probe.measure(sha)[0], good_sample)
        verdict, reason, change = judge(metric, sample, base, alongside=metric.interleave)
        return record(
            _step(sha, probe.pinned(sha).variant, "probe", sample, verdict, reason, base, change, metric.interleave)
        ).verdict

    ends = [*rng.candidates, rng.bad]
    first, suspects = search(len(rng.candidates), judged)
    if first is None:
        result.undecided = [ends[i] for i in suspects]
    else:
        result.first_bad = ends[first]
        result.first_bad_title, result.first_bad_date = rng.described(result.first_bad)
    return result


def _ends(result: PerfResult, rng: Range, probe: _Probe, record: Callable[[PerfStep], object]) -> Sample:
    """Measure both ends first (alternating, with interleave; else the good end first); set `result.stopped`
    when they cannot be measured or show no drift to find. Returns the good end's sample, the baseline."""
    metric = probe.metric
    g, b = probe.measure(rng.good, rng.bad) if metric.interleave else (probe.measure(rng.good)[0], None)
    why = g.failure
    if not why:
        assert g.spread is not None  # not failed: it has runs (the good end's come first)
        if g.spread > metric.threshold:
            why = (
                f"its runs spread {g.spread:.1f}% (MAD) > the {metric.threshold:g}% threshold "
                "(more --repeat, a larger --threshold, or a quieter machine)"
            )
    result.good_median = g.median
    record(
        _step(rng.good, probe.pinned(rng.good).variant, "good end", g, "skip" if why else "good", why or "the baseline")
    )
    if why:  # the bad end is not measured: nothing could be compared with it
        result.stopped = f"cannot measure the good end {rng.good[:12]}: {why}"
        return g
    b = b or probe.measure(rng.bad)[0]
    result.bad_median = b.median
    verdict, reason, change = judge(metric, b, g, alongside=False)
    record(_step(rng.bad, probe.pinned(rng.bad).variant, "bad end", b, verdict, reason, g, change))
    result.change = change
    if verdict == "skip":
        result.stopped = f"cannot measure the bad end {rng.bad[:12]}: {reason}"
    elif verdict == "good":
        assert change is not None  # judge's "good" comes with its change
        if change < -metric.threshold:
            hint = "--lower-is-better" if metric.higher_is_better else "--higher-is-better"
            how = f"the bad end is {-change:.1f}% better ({metric.direction}; pass {hint} if not)"
        else:
            how = f"{change:+.1f}%, within the {metric.threshold:g}% threshold"
        result.stopped = f"no drift to find: good median {g.median:g}, bad median {b.median:g} ({how})"
    return g
