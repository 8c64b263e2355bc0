"""Bisect a drift: a real `kernels.get_kernel` in a subprocess with no network judges each commit."""

from __future__ import annotations

import json
import math
import sys
import textwrap

import pytest

from tests.support.cli import run_bisect, run_cli
from tests.support.fakehub import FakeRepo
from tests.support.kernel_fixtures import ARM_CPU, ORG, X86_CPU, build, variant_files

DRIFT = f"{ORG}/drift"
TARGET = "torch2.13-cpu-x86_64-linux"
N_COMMITS = 20
REGRESSION = 13  # from this commit on, add() is off by one
HANG = 5  # this commit's kernel hangs on import (a timeout: skipped)
CRASH_FROM = 16  # these commits' kernels abort the process (a crash: counted bad)

KERNEL = """VERSION = 1
VARIANT = "{variant}"
INDEX = {i}
MODE = "{mode}"


def add(a, b):
    return a + b + {offset}
"""


def drift_repo() -> tuple[FakeRepo, list[str]]:
    """20 commits on v1; every commit i with i % 4 == 2 has no x86 CPU build (skipped by bisect)."""
    repo, shas = FakeRepo(DRIFT), []
    for i in range(N_COMMITS):
        variants = [ARM_CPU] if i % 4 == 2 else [X86_CPU, ARM_CPU]
        files = build("drift", [], version=1)
        mode = "hang" if i == HANG else "crash" if i >= CRASH_FROM else "ok"
        for v in variants:
            init = KERNEL.format(variant=v, i=i, mode=mode, offset=int(i >= REGRESSION)).encode()
            files.update(variant_files("drift", v, version=1, extra={"__init__.py": init}))  # in the digest
        shas.append(repo.commit(files, title=f"drift build {i}", branch="v1"))
    return repo, shas


CHECK = textwrap.dedent("""
    import os, sys, time
    import kernels
    k = kernels.get_kernel("kernels-test/drift", version=1)
    print("probe", k.INDEX, k.MODE, flush=True)
    if k.MODE == "hang":
        time.sleep(600)
    if k.MODE == "crash":
        os.abort()
    sys.exit(0 if k.add(2, 3) == 5 else 1)
""")


@pytest.fixture
def drift(hub, tmp_path):
    repo, shas = drift_repo()
    hub.add_repo(repo)
    script = tmp_path / "check.py"
    script.write_text(CHECK)
    return shas, script


def test_bisect_finds_the_first_bad_commit_with_skips_a_hang_and_crashes(hub, home, drift):
    shas, script = drift
    # The command runs with no network at all: only the pinned, staged commit can load.
    cmd = ["unshare", "-n", sys.executable, str(script)]
    p = run_bisect(
        hub.url, DRIFT, shas[0], shas[-1], "--timeout", "20", "--json", target=TARGET, cmd=cmd, home=home, timeout=600
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["first_bad"] == shas[REGRESSION]
    assert doc["first_bad_title"] == f"drift build {REGRESSION}" and doc["first_bad_date"]
    no_build = {shas[i] for i in range(1, N_COMMITS - 1) if i % 4 == 2}
    assert {s["commit"] for s in doc["skipped"]} == no_build
    assert all(f"no build for {TARGET}" in s["reason"] for s in doc["skipped"])
    n = N_COMMITS - 2
    assert doc["runs"] <= math.ceil(math.log2(n)) + 2
    by_commit = {s["commit"]: s for s in doc["steps"]}
    for s in doc["steps"]:
        assert s["variant"] == X86_CPU and s["seconds"] >= 0
        i = shas.index(s["commit"])
        expected = "skip" if i == HANG else "good" if i < REGRESSION else "bad"
        assert s["verdict"] == expected, (i, s)
    if shas[HANG] in by_commit:
        assert by_commit[shas[HANG]]["exit_code"] is None and "timed out" in by_commit[shas[HANG]]["note"]


def test_hang_and_crash_are_handled_when_probed(hub, home, drift):
    """A narrower range that forces probes of the hanging and the crashing commits."""
    shas, script = drift
    cmd = ["unshare", "-n", sys.executable, str(script)]
    p = run_bisect(
        hub.url,
        DRIFT,
        shas[HANG - 1],
        shas[HANG + 2],
        "--timeout",
        "5",
        "--json",
        target=TARGET,
        cmd=cmd,
        home=home,
        timeout=300,
    )
    doc = json.loads(p.stdout)
    hang = [s for s in doc["steps"] if s["commit"] == shas[HANG]]
    assert hang and hang[0]["verdict"] == "skip" and hang[0]["exit_code"] is None
    # Only the hang and a commit without a build lie between: the answer is the bad end, or undecided.
    assert p.returncode in (0, 1)

    p = run_bisect(
        hub.url, DRIFT, shas[CRASH_FROM - 2], shas[-1], "--json", target=TARGET, cmd=cmd, home=home, timeout=300
    )
    doc = json.loads(p.stdout)
    crashes = [s for s in doc["steps"] if shas.index(s["commit"]) >= CRASH_FROM]
    assert crashes and all(s["verdict"] == "bad" and s["exit_code"] < 0 and "signal" in s["note"] for s in crashes)


def test_pin_prints_the_env_for_one_commit(hub, home, drift):
    shas, _ = drift
    p = run_cli("--endpoint", hub.url, "pin", DRIFT, shas[7], "--target", TARGET, "--format", "json", home=home)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["commit"] == shas[7] and doc["env"]["FRT_KERNEL_REV_KERNELS_TEST_DRIFT"] == shas[7]
    assert shas[7] in doc["env"]["LOCAL_KERNELS"]
    # A commit without the target's build is a refusal, exit 1.
    p = run_cli("--endpoint", hub.url, "pin", DRIFT, shas[6], "--target", TARGET, home=home)
    assert p.returncode == 1 and "none for torch2.13-cpu-x86_64-linux" in p.stderr


def test_bad_ranges_are_bad_input(hub, home, drift):
    shas, _ = drift
    p = run_bisect(hub.url, DRIFT, shas[5], shas[2], target=TARGET, cmd=["true"], home=home)
    assert p.returncode == 2 and "is not an ancestor" in p.stderr


MERGED = f"{ORG}/merged"


def merged_repo() -> tuple[FakeRepo, dict[str, str]]:
    """main: A - B - M, where M merges a side branch off A (S, dated after B) that was then deleted,
    as a merged pull request's branch is. The Hub lists M's history by date: M, S, B, A; so the
    entry after S is B, which is not S's parent."""
    repo = FakeRepo(MERGED)
    shas = {"A": repo.commit(build("merged", [X86_CPU], version=1, note="a"), title="A", branch="main")}
    repo.branch("side", "main")
    shas["B"] = repo.commit(build("merged", [X86_CPU], version=1, note="b"), title="B", branch="main")
    shas["S"] = repo.commit(build("merged", [X86_CPU], version=1, note="s"), title="S", branch="side")
    shas["M"] = repo.commit(build("merged", [X86_CPU], version=1, note="m"), title="M", branch="main", merge="side")
    del repo.branches["side"]
    assert [c.title for c in repo.history(shas["M"])] == ["M", "S", "B", "A"]
    return repo, shas


def test_across_a_merge_the_range_is_what_the_upstream_lists_not_next_entry_parents(hub, home):
    """Taking the next entry of the Hub's list for a parent made B an ancestor of S, and bisect then
    searched a range that is not one. Each end's own listing says what it reaches."""
    repo, shas = merged_repo()
    hub.add_repo(repo)
    p = run_bisect(hub.url, MERGED, shas["B"], shas["S"], target=TARGET, cmd=["true"], home=home)
    assert p.returncode == 2 and "is not an ancestor" in p.stderr, p.stderr
    p = run_bisect(hub.url, MERGED, shas["A"], shas["M"], "--json", target=TARGET, cmd=["true"], home=home, timeout=300)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)  # every probe is good, so the answer is bad itself
    assert doc["candidates"] == [shas["B"], shas["S"]] and doc["first_bad"] == shas["M"]
