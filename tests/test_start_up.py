"""Start-up (issue "Start-up, import and the S3 store at disk speed"): the CLI loads a command's module when
that command runs (app.COMMANDS), `env --target` on a job start reads a SQLite ledger with sqlite3 alone
(store/staged.py) and remembers `--target host` (resolver/host_cache.py). The figures are bench/startup.py's;
here, what each shortcut must give: the same answer as the long way, and none of the heavy imports."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import sqlite3
import subprocess
from pathlib import Path
from types import SimpleNamespace

import click
import pytest

from frt.cli.app import COMMANDS, cli
from frt.mirror.home_path import MIRROR_VERSION
from frt.mirror.store.home import Home
from frt.mirror.store.records import staged_for
from frt.mirror.store.staged import quick_staged
from frt.resolver.host_cache import remembered_host
from frt.resolver.targets import _host_fields, _host_from_fields, host_target
from tests.support.cli import ARM_CU, EXE, X86, cli_env, run_cli_process, write_manifest
from tests.support.fakehub import FakeHub
from tests.support.kernel_fixtures import ACTIVATION, LAYERNORM, ORG, RELU, demo_repos, fleet_repos
from tests.support.startup import loaded_after

# The fixture home has activation at v1 and v2: env leaves it out unless one is chosen.
ONE_VERSION = ["--version", f"{ACTIVATION}=1"]


def test_every_command_is_where_commands_says_and_nowhere_else():
    """app.COMMANDS is the listing `--help` prints without loading a command: each name must be a command
    its module defines, and no module may register a command the table does not name."""
    ctx = click.Context(cli)
    for name, (module, line) in COMMANDS.items():
        cmd = cli.get_command(ctx, name)
        assert cmd is not None and cmd.name == name, name
        assert cmd.callback is None or cmd.callback.__module__ == f"frt.cli.{module}", (name, cmd.callback.__module__)
        assert line.endswith(".") and len(name) + len(line) <= 72, (name, line)  # 80 columns, no click "..."
    for module in {m for m, _ in COMMANDS.values()}:
        importlib.import_module(f"frt.cli.{module}")
    assert set(cli.commands) == set(COMMANDS)


def test_help_lists_every_command_and_loads_none():
    p, loaded = loaded_after(["--help"])
    assert p.returncode == 0, p.stderr
    block = p.stdout.split("Commands:\n")[1].split("\n\n")[0]
    assert [line.split()[0] for line in block.splitlines()] == sorted(COMMANDS)
    modules = {m for m, _ in COMMANDS.values()}
    assert not [m for m in loaded["ours"] if m.startswith("frt.cli.") and m.rpartition(".")[2] in modules]
    assert loaded["heavy"] == []


def test_a_command_loads_its_own_module_only(home_a):
    p, loaded = loaded_after(["--home", str(home_a.home), "nginx-conf"])
    assert p.returncode == 0, p.stderr
    modules = {m.rpartition(".")[2] for m in loaded["ours"] if m.startswith("frt.cli.")}
    assert "nginx_cmd" in modules and not modules & {"stage_cmds", "serve_cmds", "bisect_cmds", "ledger_cmds"}


@pytest.mark.parametrize(("target", "choose"), [(X86, ONE_VERSION), (ARM_CU, [])])
def test_env_on_a_job_start_reads_the_ledger_without_sqlalchemy_and_answers_the_same(home_a, target, choose):
    p, loaded = loaded_after(["--home", str(home_a.home), "env", "--target", target, *choose, "--format", "json"])
    assert p.returncode == 0, p.stderr
    assert loaded["heavy"] == [], loaded["heavy"]
    slow = Home(home_a.home, readonly=True)
    try:
        rows = staged_for(slow.ledger, target)
    finally:
        slow.close()
    assert rows and quick_staged(home_a.home / "ledger.sqlite", target) == rows
    got = json.loads(p.stdout)["kernels"]
    chosen = [r for r in rows if r.repo != ACTIVATION or not choose or r.version == 1]
    assert [(k["repo"], k["commit"], k["variant"]) for k in got] == [(r.repo, r.commit, r.variant) for r in chosen]


def _ledger_copy(home_a, tmp_path: Path) -> Path:
    home = tmp_path / "home"
    shutil.copytree(home_a.home, home, symlinks=True)
    return home


def test_the_quick_read_carries_wheels_and_gives_way_where_it_cannot_answer(home_a, tmp_path):
    home = _ledger_copy(home_a, tmp_path)
    ledger = home / "ledger.sqlite"
    row = quick_staged(ledger, X86)[0]  # type: ignore[index]
    with sqlite3.connect(ledger) as con:
        con.execute(
            "INSERT INTO staged_wheels (repo_id, requested, target, filename) VALUES (?, ?, ?, ?)",
            (row.repo, row.requested, row.target, "tinyadd-1.0-py3-none-any.whl"),
        )
    slow = Home(home, readonly=True)
    try:
        assert quick_staged(ledger, X86) == staged_for(slow.ledger, X86)
    finally:
        slow.close()
    assert quick_staged(ledger, X86)[0].wheels == ("tinyadd-1.0-py3-none-any.whl",)  # type: ignore[index]

    def gives_way(change: str, *args) -> None:
        copy = tmp_path / f"c{len(list(tmp_path.iterdir()))}.sqlite"
        shutil.copy(ledger, copy)
        with sqlite3.connect(copy) as con:
            con.execute(change, args)
        assert quick_staged(copy, X86) is None, change

    # a pulled-through variant: which one a target takes is kernels' rule (records.staged_for)
    gives_way(
        "INSERT INTO staged (repo_id, requested, version, revision, target, commit_sha, variant, staged_at) "
        "VALUES ('o/r', 'v1', 1, NULL, 'pulled:torch213-cxx11-cpu-x86_64-linux', ?, 'v', '2026-01-01')",
        "0" * 40,
    )
    gives_way("INSERT INTO mirror_schema_migrations (version, applied_at) VALUES (?, '2030-01-01')", MIRROR_VERSION + 1)
    gives_way("UPDATE mirror_schema_migrations SET version = ?", MIRROR_VERSION - 1)
    gives_way("DELETE FROM mirror_schema_migrations WHERE version = ?", MIRROR_VERSION)
    gives_way("DELETE FROM schema_migrations")
    gives_way("DROP TABLE staged_wheels")
    empty = tmp_path / "empty.sqlite"
    empty.write_bytes(b"")
    assert quick_staged(empty, X86) is None
    assert quick_staged(tmp_path / "absent.sqlite", X86) is None
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"not a database" * 100)
    assert quick_staged(garbage, X86) is None


def test_env_on_a_ledger_to_migrate_takes_the_ledgers_path_and_says_so(home_a, tmp_path):
    """A ledger at an older schema on a read-only home: the quick read gives way, and the ledger's own
    one line (migrate it where the home is writable) is what env says, as before."""
    home = _ledger_copy(home_a, tmp_path)
    with sqlite3.connect(home / "ledger.sqlite") as con:
        con.execute("UPDATE mirror_schema_migrations SET version = ?", (MIRROR_VERSION - 1,))
    p = subprocess.run(
        [str(EXE), "--home", str(home), "env", "--target", X86, *ONE_VERSION],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=120,
    )
    assert p.returncode == 0, p.stderr  # writable: the ledger's path migrated it
    with sqlite3.connect(home / "ledger.sqlite") as con:
        assert con.execute("SELECT max(version) FROM mirror_schema_migrations").fetchone() == (MIRROR_VERSION,)


TORCH_DIR = Path(__file__).parent  # any folder: only its version.py's modification time is read


def test_host_is_detected_once_per_installation_and_again_when_it_changes(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    calls = []

    def detect():
        calls.append(1)
        return _host_fields(host_target())

    first = remembered_host(detect, TORCH_DIR)
    assert remembered_host(detect, TORCH_DIR) == first and len(calls) == 1
    assert _host_from_fields(first) == host_target() and _host_from_fields(first).python == host_target().python
    (site / "torch_tpu-1.0.dist-info").mkdir()  # a distribution installed: the folder on sys.path changed
    os.utime(site, ns=(os.stat(site).st_atime_ns, os.stat(site).st_mtime_ns + 10**9))
    assert remembered_host(detect, TORCH_DIR) == first and len(calls) == 2
    monkeypatch.setenv("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    remembered_host(detect, TORCH_DIR)
    assert len(calls) == 3
    kept_files = list((tmp_path / "cache" / "frt-mirror" / "host-targets").iterdir())
    assert len(kept_files) == 1  # one per interpreter and machine, rewritten as the installation changes
    for damage in (lambda b: b[: len(b) // 2], lambda b: b"\xff" + b[1:], lambda b: b""):  # detected again
        for kept in kept_files:
            kept.write_bytes(damage(kept.read_bytes()))
        remembered_host(detect, TORCH_DIR)
    assert len(calls) == 6


def test_env_target_host_imports_no_torch_once_remembered(home_a, tmp_path):
    pytest.importorskip("torch", reason="--target host needs torch on the box")
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    argv = ["--home", str(home_a.home), "env", "--target", "host", *ONE_VERSION, "--format", "json"]
    first, loaded_first = loaded_after(argv, env)
    assert first.returncode == 0, first.stderr
    assert "torch" in loaded_first["heavy"]  # detected as kernels does it
    again, loaded = loaded_after(argv, env)
    assert again.returncode == 0 and again.stdout == first.stdout, again.stderr
    assert loaded["heavy"] == [], loaded["heavy"]


def test_report_reads_the_refusals_without_sqlalchemy_and_answers_the_same(home_a):
    """report is the other reader a cluster's cron runs often: the refusals, by the quick read."""
    p, loaded = loaded_after(["--home", str(home_a.home), "report", "--json"])
    assert p.returncode == 0, p.stderr
    assert loaded["heavy"] == [], loaded["heavy"]
    slow = Home(home_a.home, readonly=True)
    try:
        rows = slow.ledger.refusals()
    finally:
        slow.close()
    quick = Home(home_a.home, readonly=True).refusals()
    assert rows and quick == rows
    got = json.loads(p.stdout)
    assert [(r["repo"], r["target"], r["error"], r["last_seen"]) for r in got] == [
        (r.repo_id, r.target, r.error, r.last_seen.isoformat()) for r in rows
    ]


def test_the_quick_reads_know_every_table_of_this_schema():
    """A ledger at this version missing a table is refused by the ledger's own open (one line, exit 2): the
    quick read gives way to it only if it knows the tables, which it keeps without SQLAlchemy."""
    from frt.mirror.home_path import MIRROR_TABLES
    from frt.mirror.schema import MIRROR_TRACK
    from frt.resolver.ledger.schema import RESOLVER_TRACK
    from frt.resolver.ledger_file import TABLES

    assert set(RESOLVER_TRACK.metadata.tables) == TABLES
    assert set(MIRROR_TRACK.metadata.tables) == MIRROR_TABLES


def test_env_under_a_writer_holding_the_ledger_answers_every_job_from_the_last_commit(home_a, tmp_path):
    """A job start while a stage or import writes: the quick read takes its own read snapshot (WAL), so 16
    env calls at once, during a write transaction held open, all answer, none waits on the writer, and none
    sees the row the writer has not committed."""
    import threading

    home = _ledger_copy(home_a, tmp_path)
    writer = sqlite3.connect(home / "ledger.sqlite", isolation_level=None)
    writer.execute("PRAGMA journal_mode = WAL")
    writer.execute("BEGIN IMMEDIATE")
    writer.execute(
        "INSERT INTO staged (repo_id, requested, version, target, commit_sha, variant, staged_at) "
        "VALUES ('late/kernel', 'v1', 1, ?, ?, 'v', '2026-01-01')",
        (X86, "1" * 40),
    )
    results: list[subprocess.CompletedProcess] = []

    def job() -> None:
        argv = [str(EXE), "--home", str(home), "env", "--target", X86, *ONE_VERSION, "--format", "json"]
        results.append(subprocess.run(argv, capture_output=True, text=True, env=cli_env(), timeout=120))

    try:
        jobs = [threading.Thread(target=job) for _ in range(16)]
        for j in jobs:
            j.start()
        for j in jobs:
            j.join()
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    failed = [p.stderr for p in results if p.returncode != 0]
    assert len(results) == 16 and failed == []
    seen = {tuple(k["repo"] for k in json.loads(p.stdout)["kernels"]) for p in results}
    assert len(seen) == 1 and "late/kernel" not in next(iter(seen))


# -- matrix: the ledger read with sqlite3 alone, kernels' answers remembered (resolver/decisions_memo.py) ------

FLEET = "torch2.13-cu130-x86_64-linux@8.0,9.0"  # hopper-fb's 9.0-only build would raise on the 8.0 devices


@pytest.fixture(scope="module")
def fresh_home(tmp_path_factory) -> SimpleNamespace:
    """Layernorm and hopper-fb staged by a stage process of their own, into a home and a cache folder of
    their own: what the first `matrix` after a stage finds."""
    root = tmp_path_factory.mktemp("matrix")
    env = cli_env(XDG_CACHE_HOME=str(root / "cache"))
    m = write_manifest(root / "m.toml", {LAYERNORM: {"version": 1}, f"{ORG}/hopper-fb": {"version": 1}}, [X86, FLEET])
    with FakeHub([*demo_repos(), *fleet_repos()], trusted_orgs=[ORG]) as hub:
        p = run_cli_process("--endpoint", hub.url, "stage", str(m), "--json", home=root / "home", env=env)
    assert json.loads(p.stdout)["rows"], p.stderr
    return SimpleNamespace(home=root / "home", cache=root / "cache", env=env)


def _through_the_ledger(home: Path, *argv: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """The same command on the ledger's own path (SQLAlchemy): named by URL, the ledger is not read quick."""
    return run_cli_process("--ledger", f"sqlite:///{home / 'ledger.sqlite'}", *argv, home=home, env=env)


@pytest.mark.parametrize("repo", [LAYERNORM, f"{ORG}/hopper-fb", ACTIVATION])
@pytest.mark.parametrize("as_json", [[], ["--json"]])
def test_the_first_matrix_after_a_stage_imports_neither_sqlalchemy_nor_kernels(fresh_home, repo, as_json):
    argv = ["matrix", repo, *as_json]
    p, loaded = loaded_after(["--home", str(fresh_home.home), *argv], {"XDG_CACHE_HOME": str(fresh_home.cache)})
    assert p.returncode == 0, p.stderr
    assert loaded["heavy"] == [], loaded["heavy"]
    slow = _through_the_ledger(fresh_home.home, *argv, env=fresh_home.env)
    assert (p.returncode, p.stdout, p.stderr) == (slow.returncode, slow.stdout, slow.stderr)
    assert FLEET in p.stdout


def test_a_target_never_decided_asks_kernels_once_and_keeps_its_answer(fresh_home, tmp_path):
    cache = tmp_path / "cache"
    shutil.copytree(fresh_home.cache, cache)
    target = "torch2.11-cu130-x86_64-linux@9.0"
    argv = ["--home", str(fresh_home.home), "matrix", f"{ORG}/hopper-fb", "--target", target]
    first, loaded = loaded_after(argv, {"XDG_CACHE_HOME": str(cache)})
    assert first.returncode == 0, first.stderr
    assert "kernels" in loaded["heavy"] and "sqlalchemy" not in loaded["heavy"]  # asked; the ledger read quick
    again, loaded = loaded_after(argv, {"XDG_CACHE_HOME": str(cache)})
    assert (again.returncode, again.stdout) == (0, first.stdout) and loaded["heavy"] == [], again.stderr


def test_every_answer_kept_is_kernels_own(fresh_home):
    """What stage kept for the matrix, asked of kernels afresh: the same answer, for each rule."""
    from frt.resolver.archs import cuda_by_kernels
    from frt.resolver.variants import decide_by_kernels, fields_by_kernels

    ask = {"decide": decide_by_kernels, "fields": fields_by_kernels, "cuda": cuda_by_kernels}
    (kept,) = (fresh_home.cache / "frt-mirror" / "kernels-decisions").iterdir()
    rules = json.loads(kept.read_text())["rules"]
    assert set(rules) == set(ask) and all(rules.values())
    for rule, answers in rules.items():
        for inputs, answer in answers.items():
            assert ask[rule](*json.loads(inputs)) == answer, (rule, inputs)


def test_each_input_of_kernels_and_its_installation_keys_an_answer(tmp_path, monkeypatch):
    from dataclasses import replace

    from packaging.version import Version

    from frt.resolver.decisions_memo import Memo, installation, memo
    from frt.resolver.targets import parse_target
    from frt.resolver.variants import _decide, decide

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    _decide.cache_clear()  # answered in this process already: not asked of the memo again
    base = parse_target("torch2.13-cu130-x86_64-linux")
    targets = [
        base,
        replace(base, backend="cu128"),
        replace(base, cpu="aarch64"),
        replace(base, os="windows"),
        replace(base, torch=Version("2.12")),
        replace(base, abi=False),
        replace(base, tvm_ffi=Version("0.1")),
        replace(base, macos=Version("26.0")),
    ]
    names = ["torch213-cxx11-cu130-x86_64-linux", "torch-cuda"]
    for t in targets:
        decide(t, names)
    decide(base, names[:1])
    memo().save()
    (kept,) = (tmp_path / "cache" / "frt-mirror" / "kernels-decisions").iterdir()
    assert len(json.loads(kept.read_text())["rules"]["decide"]) == len(targets) + 1

    site = tmp_path / "site"
    (site / "kernels").mkdir(parents=True)
    for name in ("variants.py", "backends.py", "archs.py"):
        (site / "kernels" / name).write_text("# kernels' rules\n")
    (site / "kernels-0.17.2.dist-info").mkdir()
    first = installation(site / "kernels")
    assert first[0] == "0.17.2"
    (site / "kernels-0.17.2.dist-info").rename(site / "kernels-0.17.3.dist-info")
    upgraded = installation(site / "kernels")
    assert upgraded[0] == "0.17.3" and upgraded[1] != first[1]
    (site / "kernels" / "variants.py").write_text("# kernels' rules, edited in place (an editable install)\n")
    assert installation(site / "kernels")[1] not in (first[1], upgraded[1])

    path = tmp_path / "memo.json"
    asked: list[int] = []
    old = Memo(path, first[1])
    old.answer("fields", ["x"], lambda name: asked.append(1) or ["noarch"])
    old.save()
    Memo(path, first[1]).answer("fields", ["x"], lambda name: asked.append(1) or ["noarch"])
    assert len(asked) == 1  # kept, for this installation
    Memo(path, upgraded[1]).answer("fields", ["x"], lambda name: asked.append(1) or ["noarch"])
    assert len(asked) == 2  # another installation's answers are not this one's
    path.write_text('{"key": "x"')
    Memo(path, first[1]).answer("fields", ["x"], lambda name: asked.append(1) or ["noarch"])
    assert len(asked) == 3  # damaged: asked again


def test_the_quick_matrix_reads_what_the_ledger_view_reads(home_a, tmp_path):
    """On a staged home, for each repo (and one never scanned): RepoRecords answers build_matrix's reads
    as LedgerView does, and quick_matrix gives the matrix the ledger's path gives."""
    from frt.mirror.store.matrix_reads import quick_matrix, staged_columns
    from frt.resolver.commit_records import read_repo
    from frt.resolver.matrix import build_matrix
    from frt.resolver.targets import parse_target

    quick = Home(home_a.home, readonly=True)
    slow = Home(home_a.home, readonly=True)
    arch_targets = [parse_target(FLEET), parse_target("torch2.11-cu130-aarch64-linux@8.0")]
    try:
        repos = slow.ledger.repos()
        assert set(repos) >= {LAYERNORM, ACTIVATION, RELU}
        staged = slow.staged()
        with slow.ledger.view() as view:
            for repo in [*repos, f"{ORG}/never-scanned"]:
                records = quick.quick(lambda conn, repo=repo: read_repo(conn, repo))
                assert records is not None and records.known(repo) == view.known(repo), repo
                assert records.refs(repo) == view.refs(repo) and records.commits(repo) == view.commits(repo), repo
                for c in view.commits(repo):
                    assert records.variant_names(repo, c.sha) == view.variant_names(repo, c.sha), (repo, c.sha)
                    assert records.declared(repo, c.sha) == view.declared(repo, c.sha), (repo, c.sha)
                if not view.known(repo):
                    assert quick_matrix(quick, repo, None) is None  # the ledger's path says why, naming near ones
                    continue
                also = staged_columns(r.target for r in staged if r.repo == repo)
                assert quick_matrix(quick, repo, None) == build_matrix(view, repo, None, also=also), repo
                assert build_matrix(records, repo, arch_targets) == build_matrix(view, repo, arch_targets), repo
    finally:
        slow.close()
    assert Home(home_a.home, ledger_url=f"sqlite:///{home_a.home / 'ledger.sqlite'}").quick(read_repo) is None
    home = _ledger_copy(home_a, tmp_path)
    with sqlite3.connect(home / "ledger.sqlite") as con:  # a model staged under the repo's name: its own answer
        con.execute(
            "INSERT INTO staged (repo_id, requested, version, revision, target, commit_sha, variant, staged_at) "
            "VALUES (?, 'main', NULL, 'main', 'model', ?, 'files', '2026-01-01')",
            (RELU, "0" * 40),
        )
    assert quick_matrix(Home(home, readonly=True), RELU, None) is None
