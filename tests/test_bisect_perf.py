"""Bisect a performance drift: a kernel whose speed changes by commit, timed through the real
`kernels.get_kernel` in a subprocess with no network, judged by the median of the figure it prints."""

from __future__ import annotations

import json
import re
import sys
import textwrap

import pytest

from tests.support.cli import cli_env, run_bisect
from tests.support.fakehub import FakeRepo
from tests.support.kernel_fixtures import ARM_CPU, ORG, X86_CPU, build, variant_files

SPEED = f"{ORG}/speed"
TARGET = "torch2.13-cpu-x86_64-linux"
# Milliseconds one call of op() sleeps, by commit: a 5% drift at 3 (inside every threshold used
# here) and a 3x slowdown from 5 on, far above what a loaded two-core machine adds to a sleep.
SLEEP_MS = [2.0, 2.0, 2.0, 2.1, 2.1, 6.0, 6.0, 6.0]
SLOW_FROM = 5
NO_BUILD = 6  # only an aarch64 build: not a candidate for the x86 target
THRESHOLD = "30"

KERNEL = """import time

VERSION = 1
INDEX = {i}


def op():
    time.sleep({ms} / 1000)
"""

# Prints µs per call (or calls/s with METRIC=rate). Two switches stand in for an unkind machine:
# NOISY=i,j scales commit i's and j's figures by 1/4, 1, 4 in turn (a spread far larger than the 3x
# effect, cycling so that any three runs of such a commit scatter the same way every time), and
# SLOWING=1 makes every run 15% slower than the run before it, whatever the commit.
TIMING = textwrap.dedent("""
    import os, pathlib, statistics, sys, time
    import kernels
    k = kernels.get_kernel("kernels-test/speed", version=1)
    k.op()
    times = []
    for _ in range(21):
        t0 = time.perf_counter()
        k.op()
        times.append(time.perf_counter() - t0)
    us = statistics.median(times) * 1e6  # a call the machine delayed does not move the median
    state = pathlib.Path(os.environ["STATE_DIR"])
    def count(name):
        f = state / name
        n = int(f.read_text()) if f.exists() else 0
        f.write_text(str(n + 1))
        return n
    if os.environ.get("SLOWING"):
        us *= 1 + 0.15 * count("all")
    if str(k.INDEX) in os.environ.get("NOISY", "").split(","):
        us *= (0.25, 1, 4)[count(f"noisy-{k.INDEX}") % 3]
    if str(k.INDEX) in os.environ.get("FAIL", "").split(","):
        sys.exit(1)
    if os.environ.get("METRIC") == "rate":
        print(f"calls_per_s: {1e6 / us:.2f}")
    else:
        print(f"us_per_call: {us:.1f}")
""")

LOWER = r"us_per_call: (?P<value>[\d.]+)"
HIGHER = r"calls_per_s: ([\d.]+)"


def speed_repo() -> tuple[FakeRepo, list[str]]:
    repo, shas = FakeRepo(SPEED), []
    for i, ms in enumerate(SLEEP_MS):
        files = build("speed", [], version=1)
        for v in [ARM_CPU] if i == NO_BUILD else [X86_CPU, ARM_CPU]:
            init = KERNEL.format(i=i, ms=ms).encode()
            files.update(variant_files("speed", v, version=1, extra={"__init__.py": init}))
        shas.append(repo.commit(files, title=f"speed build {i}", branch="v1"))
    return repo, shas


@pytest.fixture
def speed(hub, home, tmp_path):
    repo, shas = speed_repo()
    hub.add_repo(repo)
    script = tmp_path / "timing.py"
    script.write_text(TIMING)
    state = tmp_path / "state"
    state.mkdir()

    cmd = ["unshare", "-n", sys.executable, str(script)]

    def bisect(good: int, bad: int, *opts: str, **env: str):
        opts = ("--repeat", "3", "--threshold", THRESHOLD, *opts)
        env = cli_env(STATE_DIR=str(state), **env)
        p = run_bisect(
            hub.url, SPEED, shas[good], shas[bad], *opts, target=TARGET, cmd=cmd, home=home, env=env, timeout=900
        )
        assert p.returncode in (0, 1), p.stderr[-3000:]
        return p

    return shas, bisect


def steps_by_index(doc, shas) -> dict[int, dict]:
    return {shas.index(s["commit"]): s for s in doc["steps"] if s["role"] == "probe"}


def test_the_first_slow_commit_is_found(speed):
    shas, bisect = speed
    p = bisect(2, 7, "--metric", LOWER, "--json")
    assert p.returncode == 0
    doc = json.loads(p.stdout)
    assert doc["first_bad"] == shas[SLOW_FROM] and doc["first_bad_title"] == f"speed build {SLOW_FROM}"
    assert doc["first_bad_date"] and doc["direction"] == "lower is better" and not doc["stopped"]
    assert [s["commit"] for s in doc["skipped"]] == [shas[NO_BUILD]]
    good_end, bad_end = doc["steps"][:2]
    assert (good_end["role"], good_end["verdict"], bad_end["role"], bad_end["verdict"]) == (
        "good end",
        "good",
        "bad end",
        "bad",
    )
    assert 2000 <= doc["good_median"] < 3000 and doc["bad_median"] > 2 * doc["good_median"]
    probes = steps_by_index(doc, shas)
    assert probes
    for i, s in probes.items():
        assert len(s["runs"]) == 3 and s["variant"] == X86_CPU and s["spread"] < 30
        assert s["verdict"] == ("bad" if i >= SLOW_FROM else "good"), (i, s)
        assert s["baseline"] == doc["good_median"] and s["baseline_runs"] == []
    assert doc["runs"] == 3 * len(doc["steps"])


def test_a_drift_inside_the_threshold_is_no_drift(speed):
    shas, bisect = speed
    p = bisect(0, 4, "--metric", LOWER)  # 2.0 ms against 2.1 ms: 5%, inside 30%
    assert p.returncode == 1
    [line] = [ln for ln in p.stdout.splitlines() if ln.startswith("no drift")]
    assert "good median" in line and "bad median" in line and "within the 30% threshold" in line
    rows = [ln.split() for ln in p.stdout.splitlines() if ln.startswith(("good end", "bad end", "probe"))]
    assert [r[2] for r in rows] == [shas[0][:12], shas[4][:12]]  # the two ends; nothing between was run


def test_lower_is_better_on_a_rate_says_the_bad_end_is_better(speed):
    _, bisect = speed
    p = bisect(0, 7, "--metric", HIGHER, "--repeat", "1", "--json", METRIC="rate")  # calls/s, as if lower were better
    assert p.returncode == 1
    doc = json.loads(p.stdout)
    assert (
        doc["first_bad"] is None
        and doc["change"] < -30
        and [s["role"] for s in doc["steps"]] == ["good end", "bad end"]
    )
    assert doc["stopped"].startswith("no drift to find") and "pass --higher-is-better" in doc["stopped"]


def test_noise_and_failures_skip_rather_than_guess(speed):
    """Commits 4 (noisy) and 5 (its command fails) lie where the drift is: the bisect names them as
    suspects, with the first bad beside them, instead of picking one."""
    shas, bisect = speed
    p = bisect(3, 7, "--metric", LOWER, NOISY="4", FAIL="5")
    assert p.returncode == 1
    rows = {ln.split()[1]: ln for ln in p.stdout.splitlines() if ln.startswith("probe ")}
    assert set(rows) == {shas[i][:12] for i in (4, 5)}, p.stdout
    assert re.search(r"\sskip\s+its runs spread \d+\.\d% \(MAD\) > the 30% threshold", rows[shas[4][:12]])
    assert re.search(r"\sskip\s+a run exited 1$", rows[shas[5][:12]])
    assert f"skipped {shas[NO_BUILD][:12]}: no build for {TARGET}" in p.stdout
    assert f"first bad is one of {shas[4]}, {shas[5]}, {shas[7]}" in p.stdout


def test_an_end_that_cannot_be_measured_stops_in_one_line(speed):
    shas, bisect = speed
    p = bisect(0, 7, "--metric", LOWER, NOISY="0")
    assert p.returncode == 1 and f"cannot measure the good end {shas[0][:12]}: its runs spread" in p.stdout
    assert p.stderr.count("us_per_call") == 3  # the bad end was not run: nothing to compare it with
    p = bisect(0, 7, "--metric", r"tokens_per_s: (\d+)", "--json")
    doc = json.loads(p.stdout)
    assert p.returncode == 1 and "no match for" in doc["stopped"] and "us_per_call" in doc["stopped"]
    assert doc["runs"] == 0  # the first run that printed no figure ended it


def test_higher_is_better_interleaved_on_a_machine_that_slows_down(speed):
    """Every run is 15% slower than the one before. Compared with the good end measured at the start,
    commit 4 (as fast as 3) looks slow; compared with good runs taken alongside it, it does not."""
    shas, bisect = speed
    p = bisect(3, SLOW_FROM, "--metric", HIGHER, "--higher-is-better", METRIC="rate", SLOWING="1")
    assert p.returncode == 0 and f"first bad commit: {shas[4]}" in p.stdout, p.stdout  # misled
    p = bisect(
        3, SLOW_FROM, "--metric", HIGHER, "--higher-is-better", "--interleave", "--json", METRIC="rate", SLOWING="1"
    )
    assert p.returncode == 0
    doc = json.loads(p.stdout)
    assert doc["first_bad"] == shas[SLOW_FROM] and doc["direction"] == "higher is better" and doc["interleave"]
    probes = steps_by_index(doc, shas)
    assert set(probes) == {4}
    assert all(s["verdict"] == "good" and len(s["baseline_runs"]) == 3 for s in probes.values()), probes
    assert doc["bad_median"] < doc["good_median"] / 2  # calls/s: the slow end does fewer
    assert doc["runs"] == 3 * 2 + 6


@pytest.mark.parametrize(
    "opts, message",
    [
        (["--repeat", "3"], "only with --metric REGEX"),
        (["--interleave"], "only with --metric REGEX"),
        (["--metric", "(unclosed"], "not a regular expression"),
        (["--metric", "x", "--repeat", "0"], "--repeat 0: at least 1"),
        (["--metric", "x", "--threshold", "0"], "a percentage above 0"),
    ],
)
def test_bad_options_are_bad_input(hub, home, speed, opts, message):
    shas, _ = speed
    p = run_bisect(hub.url, SPEED, shas[0], shas[7], *opts, target=TARGET, cmd=["true"], home=home)
    assert p.returncode == 2 and message in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    # Refused before any work (issue 30, item 6: a bad regex failed only after staging both ends).
    assert not hub.requests and not home.exists(), hub.requests[:3]


def test_a_regex_that_never_matches_says_so_and_nothing_else(speed):
    """Issue 30, item 6: it printed a stray `good median , bad median` line besides the reason."""
    shas, bisect = speed
    p = bisect(0, 7, "--metric", r"tokens_per_s: (\d+)")
    assert p.returncode == 1 and "no match for" in p.stdout, p.stdout
    assert "good median ," not in p.stdout, p.stdout
