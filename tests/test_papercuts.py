"""The papercuts a new user and a site operator hit (issue 30, items 5 and 6), each as they met it."""

from __future__ import annotations

import json
import re

import pytest

from tests.support.cli import X86, run_cli
from tests.support.fakehub import FakeHub, RateLimits
from tests.support.kernel_fixtures import ACTIVATION, ORG, RELU, demo_repos


@pytest.fixture(scope="module")
def hub():
    with FakeHub(demo_repos(), trusted_orgs=[ORG], page_size=5) as h:
        yield h


def test_one_manifest_stages_two_versions_of_one_repo(hub, home, tmp_path):
    m = tmp_path / "m.toml"
    m.write_text(f'[kernels]\n"{ACTIVATION}" = [{{ version = 1 }}, {{ version = 2 }}]\n')
    p = run_cli("--endpoint", hub.url, "stage", str(m), "--target", X86, "--json", home=home)
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)["rows"]
    assert sorted((r["repo"], r["requested"], r["status"]) for r in rows) == [
        (ACTIVATION, "v1", "staged"),
        (ACTIVATION, "v2", "staged"),
    ]
    p = run_cli("env", "--target", X86, "--version", f"{ACTIVATION}=2", "--format", "json", home=home)
    assert p.returncode == 0, p.stderr  # two versions staged: LOCAL_KERNELS takes the one chosen
    assert [k["requested"] for k in json.loads(p.stdout)["kernels"]] == ["v2"]


def test_a_rate_limited_stage_says_it_is_waiting(home, tmp_path):
    """Issue 30, item 4 (issue 43's line): a window waited for is one line saying so (stderr is not a
    terminal here), one per window met, not one per thread; --quiet says nothing."""
    m = tmp_path / "m.toml"
    m.write_text(f'[kernels]\n"{ACTIVATION}" = {{ version = 1 }}\n')
    limits = RateLimits(api=8, resolvers=3000, window=2)
    line = re.compile(
        r"frt-mirror: waiting \d+ s for the upstream's api window \(8 per 2 s\)"
        r"(: \d+ of \d+ listings left, about \d+ s)?"
    )
    for quiet, where in ((False, home), (True, tmp_path / "quiet")):
        with FakeHub(demo_repos(), trusted_orgs=[ORG], page_size=5, rate_limits=limits) as hub:
            args = ["--endpoint", hub.url, "stage", str(m), "--target", X86, *(["--quiet"] if quiet else [])]
            p = run_cli(*args, home=where)
            api = sum(1 for _method, path, _status in hub.requests if not path.startswith("/kernels/"))
        assert p.returncode == 0 and api > limits.api, (api, p.stderr)
        waits = [ln for ln in p.stderr.splitlines() if ln.startswith("frt-mirror: waiting ")]
        if quiet:
            assert waits == [], p.stderr
        else:
            assert waits and all(line.fullmatch(w) for w in waits), p.stderr
            assert len(waits) <= -(-api // limits.api), p.stderr


BAD_HOMES = {
    "store-is-a-file": (lambda h: (h.mkdir(), (h / "store").write_text("")), "{h}/store is not a directory"),
    "parent-is-a-file": (lambda h: h.parent.write_text(""), "{p}/file is a file, not a directory"),
    "dangling-link": (lambda h: h.symlink_to(h.parent / "gone"), "{h} is a link to {p}/gone, which does not exist"),
}
COMMANDS = [
    ("verify",),
    ("gc",),
    ("report",),
    ("token", "list"),
    ("unstage", ACTIVATION),
    ("env", "--target", X86),
    ("export-cache", "OUT", "--target", X86),
    ("bundle", "OUT"),
    ("import", "BUNDLE"),
    ("stage", "MANIFEST", "--target", X86, "--endpoint", "http://127.0.0.1:9"),
]


@pytest.mark.parametrize("case", list(BAD_HOMES))
def test_a_bad_home_is_the_same_one_line_for_every_command(case, tmp_path):
    """Issue 30, item 6: one home problem, one message, whatever the command (before: `…/store/sha256: Not a
    directory`, `cannot be created or used: File exists`, `No such file or directory`, or nothing at all)."""
    make, says = BAD_HOMES[case]
    home = tmp_path / ("file/home" if case == "parent-is-a-file" else "home")
    make(home)
    m = tmp_path / "m.toml"
    m.write_text(f'[kernels]\n"{ACTIVATION}" = {{ version = 1 }}\n')
    fill = {"OUT": str(tmp_path / "out"), "BUNDLE": str(m), "MANIFEST": str(m)}
    want = f"frt-mirror: home {home} is not usable: " + says.format(h=home, p=tmp_path)
    for cmd in COMMANDS:
        p = run_cli(*(fill.get(a, a) for a in cmd), home=home)
        assert (p.returncode, p.stderr.strip()) == (2, want), (cmd, p.stderr)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "fields, line, says",
    [
        ('torch = "2.13"\nbackend = "cpu"\ncpu = "x86_64"\nos = "linxu"\n', 5, "targets[0].os: unknown os 'linxu'"),
        ('torch = "2.13"\nbackend = "cpu"\ncpu = "x68_64"\nos = "linux"\n', 4, "targets[0].cpu: unknown cpu 'x68_64'"),
        ('torch = "2.13"\nbackend = "cuda13"\ncpu = "x86_64"\nos = "linux"\n', 3, "targets[0].backend: "),
        ('torch = "2.13"\nbackend = "cpu"\ncpu = "x86_64"\nos = "linux"\narchs = ["8.0"]\n', 6, "targets[0].archs: "),
        ('target = "torch2.13-cpu-x86_64-linxu"\n', 2, "targets[0].target: unknown os 'linxu'"),
    ],
)
def test_a_target_typo_points_at_its_field(fields, line, says, tmp_path):
    """Issue 30, item 6: the line of the field at fault, not of `[[targets]]`."""
    m = tmp_path / "m.toml"
    m.write_text(f'[[targets]]\n{fields}\n[kernels]\n"{ACTIVATION}" = {{ version = 1 }}\n')
    p = run_cli("stage", str(m), "--endpoint", "http://127.0.0.1:9", home=tmp_path / "home")
    assert p.returncode == 2 and p.stderr.startswith(f"frt-mirror: {m}:{line}: {says}"), p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_matrix_shows_every_target_the_repo_is_staged_for(hub, home, tmp_path):
    """Issue 30, item 6: relu (torch-universal + an x86 CPU build) staged for three targets showed one target
    column: the default columns were the targets its variant names spell, not those it is staged for."""
    targets = [X86, "torch2.11-cu130-aarch64-linux", "torch2.12-cu128-x86_64-linux"]
    m = tmp_path / "m.toml"
    m.write_text(f'[kernels]\n"{RELU}" = {{ version = 1 }}\n')
    for t in targets:
        p = run_cli("--endpoint", hub.url, "stage", str(m), "--target", t, home=home)
        assert p.returncode == 0, p.stderr
    doc = json.loads(run_cli("matrix", RELU, "--json", home=home).stdout)
    assert set(targets) <= set(doc["targets"]), doc["targets"]
    text = run_cli("matrix", RELU, home=home).stdout
    assert all(f"  {t}" in text for t in targets), text
