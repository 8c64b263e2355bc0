"""A command's own peak RSS (max resident set size, from wait4), for tests and benches that bound it.

The command is not forked from the caller itself: a child's max RSS counts what it held before exec (a
fork's copy, and a vfork'd child's exec too charges it the parent's high-water mark), and the caller (a
pytest worker, a bench holding its fixtures) can be large. A fresh, small interpreter forks and execs it,
optionally under an address-space ceiling so that a regression cannot take the machine's memory, and
writes its exit status and max RSS to a report file."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

LAUNCHER = """
import os, resource, sys, time
guard, deadline, report, argv = int(sys.argv[1]), time.monotonic() + float(sys.argv[2]), sys.argv[3], sys.argv[4:]
pid = os.fork()
if pid == 0:
    if guard:
        resource.setrlimit(resource.RLIMIT_AS, (guard, guard))
    os.execv(argv[0], argv)
while True:
    done, status, usage = os.wait4(pid, os.WNOHANG)
    if done:
        break
    if time.monotonic() > deadline:
        os.kill(pid, 9)
        done, status, usage = os.wait4(pid, 0)
        break
    time.sleep(0.02)
open(report, "w").write(f"{os.waitstatus_to_exitcode(status)} {usage.ru_maxrss * 1024}")
"""


@dataclass(frozen=True)
class Measured:
    returncode: int  # -9: killed at the deadline
    stdout: str
    stderr: str
    seconds: float
    max_rss: int  # bytes: the command's own peak resident set


def run_measured(argv: list[str], env: dict[str, str], *, timeout: float, guard_as: int = 0) -> Measured:
    """Run `argv` (argv[0] an executable's path) to its end or `timeout` s; `guard_as`: an RLIMIT_AS in
    bytes for it (0: none)."""
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        report = Path(tmp) / "report"
        launcher = [sys.executable, "-c", LAUNCHER, str(guard_as), str(timeout), str(report)]
        t0 = time.monotonic()
        subprocess.run([*launcher, *argv], stdout=out, stderr=err, env=env, timeout=timeout + 30, check=True)
        took = time.monotonic() - t0
        code, rss = map(int, report.read_text().split())
        out.seek(0)
        err.seek(0)
        return Measured(code, out.read().decode(errors="replace"), err.read().decode(errors="replace"), took, rss)
