"""Races between `frt-mirror` processes (the installed console script, in subprocesses) on one ledger.

- Two stagers of one manifest, the second started while the first is mid-download (`two_stagers`):
  each body crosses from the upstream once, and both succeed.
- A stage held in the middle of a file's body and a gc started beside it (`stage_gc_race`): the race gc
  must lose (it waits for the stage, then takes nothing the stage stored). Their output goes to files under
  one folder: stage.out, stage.err, gc.out, gc.err.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from tests.support.cli import EXE

T = TypeVar("T")


def wait_for(what: str, check: Callable[[], T], timeout: float = 120.0) -> T:
    """Poll `check` until it returns something true, and return that; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not (got := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return got


def body_gets(hub) -> Counter:
    """How many times each file's body was fetched from the upstream."""
    return Counter(
        r.path.split("?")[0]
        for r in hub.request_log
        if r.method == "GET" and "/resolve/" in r.path and r.status in (200, 206)
    )


def two_stagers(hub, start: Callable[[int], subprocess.Popen]) -> list[dict]:
    """Start stager 0 (`start(0)`), and stager 1 once the first is mid-download; both exit 0, every body
    crossed from the upstream once and the two downloaded what was needed between them. Their --json
    reports. The caller resets the hub's log first and throttles its bodies so that the two meet."""
    first = start(0)
    assert hub.wait_for_body(1, timeout=120), "the first stager never reached its downloads"
    second = start(1)
    assert first.poll() is None, "the first stager was done before the second began: no race was tested"
    outs = [p.communicate(timeout=300) for p in (first, second)]
    for p, (_, err) in zip((first, second), outs, strict=True):
        assert p.returncode == 0, err
    gets = body_gets(hub)
    assert gets and set(gets.values()) == {1}, {p: n for p, n in gets.items() if n != 1}
    docs = [json.loads(out) for out, _ in outs]
    assert sum(d["downloaded_bytes"] for d in docs) == docs[0]["needed_bytes"]
    return docs


@dataclass
class Race:
    hub: object  # the fake Hub, whose faults hold the stage's body
    logs: list[Path]  # stage.out, stage.err, gc.out, gc.err
    files: list
    env: dict[str, str]
    stager: subprocess.Popen | None = None
    collector: subprocess.Popen | None = None

    def stage(self, *args: str) -> None:
        """Start `frt-mirror ARGS` (a stage) and wait until it is in the held body."""
        self.stager = subprocess.Popen([EXE, *args], stdout=self.files[0], stderr=self.files[1], env=self.env)
        assert self.hub.wait_for_body(1, timeout=120), "the stage never started the held body"

    def gc(self, *args: str) -> None:
        """Start `frt-mirror ARGS` (a gc) and wait until it says it waits for the stage, never exiting."""
        self.collector = subprocess.Popen([EXE, *args], stdout=self.files[2], stderr=self.files[3], env=self.env)

        def waiting() -> bool:
            assert self.collector.poll() is None, self.logs[3].read_text()
            return "waiting for the stage" in self.logs[3].read_text()

        wait_for("gc to wait for the stage", waiting)

    def finish(self) -> None:
        """Release the held body: the stage and then the gc both succeed."""
        self.hub.faults.release()
        assert self.stager.wait(timeout=120) == 0, self.logs[1].read_text()
        assert self.collector.wait(timeout=120) == 0, self.logs[3].read_text()

    def stage_json(self) -> dict:
        return json.loads(self.logs[0].read_text())

    def gc_json(self) -> dict:
        return json.loads(self.logs[2].read_text())


@contextmanager
def stage_gc_race(hub, folder: Path, env: dict[str, str]) -> Iterator[Race]:
    """The race's output files under `folder`; the held body is released whatever happens."""
    logs = [folder / n for n in ("stage.out", "stage.err", "gc.out", "gc.err")]
    files = [open(p, "w") for p in logs]
    try:
        yield Race(hub, logs, files, env)
    finally:
        hub.faults.release()
        for f in files:
            f.close()
