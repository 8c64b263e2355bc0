"""Progress for stage, bundle and import: bytes, rate and ETA when stderr is a terminal (a real pty
here, as a user's shell gives), and not one byte more on stderr when it is not, or with --quiet."""

from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import subprocess
import termios
import threading
import time
from pathlib import Path

import pytest

from tests.support.cli import X86, cli_env, write_manifest
from tests.support.kernel_fixtures import ACTIVATION, RELU

EXE = str(Path(os.sys.executable).with_name("frt-mirror"))
# tqdm's line: "<label>: 100%|████| 225k/225k [00:00<00:00, 3.1MB/s, 7/7 files]": bytes done/total,
# elapsed<ETA, rate.
METER = re.compile(
    r"(?P<label>stage|bundle|import): +\d+%\|.*\| (?P<done>[\d.]+[kMG]?)/(?P<total>[\d.]+[kMG]?) "
    r"\[\d\d:\d\d<\d\d:\d\d, +[\d.]+[kMG]?B/s, (?P<files>\d+)/(?P=files) files\]"
)


def on_pty(args: list[str], env: dict, timeout: float = 120) -> tuple[int, str, str]:
    """Run with stderr on a pseudo-terminal (80 columns) and stdout on a pipe; returns the exit code,
    stdout, and what the terminal received."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    out: list[bytes] = []
    reader = threading.Thread(target=lambda: out.append(p.stdout.read()))
    reader.start()
    term, deadline = bytearray(), time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every writer of the terminal has closed it
                    break
                if not chunk:
                    break
                term += chunk
            elif p.poll() is not None:
                break
        else:
            p.kill()
            pytest.fail(f"{args[3:5]} did not finish in {timeout} s")
    finally:
        os.close(master)
    rc = p.wait(timeout=30)
    reader.join(timeout=30)
    return rc, b"".join(out).decode(), term.decode(errors="replace")


def cli(home: Path, *args: str) -> list[str]:
    return [EXE, "--home", str(home), *args]


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    """A manifest, the fake Hub's url, and a home where it was staged on a terminal."""
    from tests.support.fakehub import FakeHub
    from tests.support.kernel_fixtures import ORG, demo_repos

    root = tmp_path_factory.mktemp("progress")
    m = write_manifest(root / "m.toml", {ACTIVATION: {"version": 1}, RELU: {"version": 1}}, [X86])
    with FakeHub(demo_repos(), trusted_orgs=[ORG]) as hub:
        yield root, m, hub


def test_stage_bundle_import_draw_bytes_rate_and_eta_on_a_terminal(staged):
    root, manifest, hub = staged
    home, env = root / "tty-home", cli_env()
    rc, out, term = on_pty(cli(home, "--endpoint", hub.url, "stage", str(manifest)), env)
    assert rc == 0, term
    tar = root / "tty.tar"
    rc2, out2, term2 = on_pty(cli(home, "bundle", str(tar)), env)
    assert rc2 == 0, term2
    rc3, out3, term3 = on_pty(cli(root / "tty-cluster", "import", str(tar)), env)
    assert rc3 == 0, term3
    for label, drawn, stdout in (("stage", term, out), ("bundle", term2, out2), ("import", term3, out3)):
        lines = [m for m in METER.finditer(drawn) if m["label"] == label]
        assert lines, f"no {label} meter on the terminal: {drawn!r}"
        last = lines[-1]
        assert last["done"] == last["total"] and "\r" in drawn, drawn  # redrawn in place, ended at 100%
        assert "|" not in stdout and "B/s" not in stdout  # the table on stdout is not mixed with it
    assert "downloaded" in out and "wrote" in out2 and "imported" in out3


def test_nothing_extra_off_a_terminal_or_with_quiet(staged):
    root, manifest, hub = staged
    home, env = root / "pipe-home", cli_env()
    p = subprocess.run(
        cli(home, "--endpoint", hub.url, "stage", str(manifest)), capture_output=True, text=True, env=env, timeout=120
    )
    assert p.returncode == 0 and p.stderr == "", p.stderr
    tar = root / "pipe.tar"
    for args in (cli(home, "bundle", str(tar)), cli(root / "pipe-cluster", "import", str(tar))):
        p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
        assert p.returncode == 0 and p.stderr == "", p.stderr
    # --quiet on a terminal: the terminal receives nothing at all.
    for args in (
        cli(root / "quiet-home", "--endpoint", hub.url, "stage", str(manifest), "--quiet"),
        cli(home, "bundle", str(root / "quiet.tar"), "--quiet"),
        cli(root / "quiet-cluster", "import", str(tar), "-q"),
    ):
        rc, out, term = on_pty(args, env)
        assert rc == 0 and term == "", (args[3:5], term)
        assert out


def test_a_large_file_has_a_line_of_its_own_while_it_is_on_its_way(tmp_path):
    """Issue 30, item 4: the overall meter says little while one large file goes; on a terminal each
    file from 4 MiB gets its own line (its bytes, rate, ETA) under the overall one, gone once it is done."""
    from tests.support.fakehub import FakeHub, FakeRepo
    from tests.support.kernel_fixtures import ORG, X86_CPU, blob, build, variant_files

    repo = FakeRepo(f"{ORG}/huge")
    files = build("huge", [], version=1)
    files.update(variant_files("huge", X86_CPU, version=1, extra={"_huge.abi3.so": blob("huge", 6 << 20)}))
    repo.commit(files, title="huge", branch="v1")
    m = write_manifest(tmp_path / "m.toml", {repo.repo_id: {"version": 1}}, [X86])
    with FakeHub([repo], trusted_orgs=[ORG]) as hub:
        rc, _, term = on_pty(cli(tmp_path / "home", "--endpoint", hub.url, "stage", str(m)), cli_env())
    assert rc == 0, term
    assert re.search(r"_huge\.abi3\.so: +\d+%\|", term), term
    overall = [x for x in METER.finditer(term) if x["label"] == "stage"]
    assert overall and overall[-1]["done"] == overall[-1]["total"], term
    rc, _, term = on_pty(cli(tmp_path / "home", "bundle", str(tmp_path / "b.tar")), cli_env())
    assert rc == 0 and re.search(r" [0-9a-f]{16}: +\d+%\|", term), term  # a blob's line, by its sha256
