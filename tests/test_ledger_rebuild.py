"""A ledger lost beside its store, made again from the store's records (`frt-mirror ledger rebuild`): on
SQLite and on PostgreSQL, every answer serve gave before (raw HTTP bytes, less the Date header, and an
unmodified huggingface_hub's snapshot) is the same byte for byte after; every command in between refuses in
one line naming the rebuild; an unstaged version stays unstaged; a record naming a missing blob writes nothing."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from tests.support.cli import ARM_CU, X86, one_line, run_cli, run_cli_process, write_manifest
from tests.support.fakehub import FakeHub, FakeRepo
from tests.support.kernel_fixtures import ACTIVATION, LAYERNORM, ORG, RELU, demo_repos
from tests.support.serve_helpers import (
    free_port,
    raw_exchange,
    raw_request,
    replica_env,
    run_client,
    serve_env,
    serving,
)

MODEL = "acme/tiny"
REBUILD = "'frt-mirror ledger rebuild'"


def _stage(tmp: Path, home: Path, *pre: str) -> Path:
    """relu v1, activation v1 and v2, layernorm v1 for two targets, and a model; activation v2 then unstaged."""
    model = FakeRepo(MODEL, repo_type="model")
    weights = bytes(range(256)) * (12 << 10)  # 3 MiB: an LFS file
    model.commit({"config.json": b'{"layers": 2}\n', "model.safetensors": weights}, title="tiny")
    kernels = {RELU: {"version": 1}, ACTIVATION: {"version": 2}, LAYERNORM: {"version": 1}}
    m = write_manifest(tmp / "m.toml", kernels, [X86, ARM_CU], trust=[ORG])
    m.write_text(m.read_text() + f'\n[models]\n"{MODEL}" = {{ revision = "main" }}\n')
    v1 = write_manifest(tmp / "v1.toml", {ACTIVATION: {"version": 1}}, [X86], trust=[ORG])
    with FakeHub([*demo_repos(), model], trusted_orgs=[ORG], page_size=5) as hub:
        for manifest in (m, v1):
            p = run_cli(*pre, "--endpoint", hub.url, "stage", str(manifest), home=home)
            assert p.returncode in (0, 1), p.stderr  # 1: activation v1 has no aarch64 CUDA build (a refusal)
    p = run_cli(*pre, "unstage", f"{ACTIVATION}@v2", home=home)
    assert p.returncode == 0, p.stderr
    return m


def _ask(port: int, method: str, path: str, body: bytes = b"") -> bytes:
    headers = ("Content-Type: application/json",) if body else ()
    status, lines, data = raw_exchange(port, raw_request(method, path, *headers, body=body))
    kept = [ln for ln in lines if not ln.lower().startswith("date:")]
    return f"{status}\r\n".encode() + "\r\n".join(kept).encode("latin-1") + b"\r\n\r\n" + data


def _answers(home: Path, tmp: Path, env: dict[str, str] | None = None) -> dict[str, bytes]:
    """Every answer a client could get about what is staged: repo info, refs, trees, commits, paths-info,
    HEAD and GET of every file; and an unmodified huggingface_hub's snapshot of relu v1 and the model."""
    out: dict[str, bytes] = {}
    with serving(home, env=env) as served:
        port = served.port
        for kind, repo, revs in (
            ("kernels", RELU, ["v1"]),
            ("kernels", ACTIVATION, ["v1", "v2"]),
            ("kernels", LAYERNORM, ["v1"]),
            ("models", MODEL, ["main"]),
        ):
            prefix = "" if kind == "models" else "kernels/"
            for path in (
                f"/api/{kind}/{repo}",
                f"/api/{kind}/{repo}/refs",
                f"/api/organizations/{repo.split('/')[0]}/overview",
            ):
                out[path] = _ask(port, "GET", path)
            for rev in revs:
                base = f"/api/{kind}/{repo}"
                for path in (
                    f"{base}/revision/{rev}",
                    f"{base}/commits/{rev}",
                    f"{base}/tree/{rev}?recursive=true&expand=true",
                ):
                    out[path] = _ask(port, "GET", path)
                tree = out[f"{base}/tree/{rev}?recursive=true&expand=true"].partition(b"\r\n\r\n")[2]
                files = [e["path"] for e in json.loads(tree)] if tree.startswith(b"[") else []
                files = [f for f in files if "." in f.rsplit("/", 1)[-1]] or files
                body = json.dumps({"paths": files, "expand": True}).encode()
                out[f"POST {base}/paths-info/{rev}"] = _ask(port, "POST", f"{base}/paths-info/{rev}", body)
                for f in files:
                    for method in ("HEAD", "GET"):
                        path = f"/{prefix}{repo}/resolve/{rev}/{f}"
                        out[f"{method} {path}"] = _ask(port, method, path)
        code = f"""
            import kernels, torch
            from huggingface_hub import snapshot_download
            k = kernels.get_kernel({ACTIVATION!r}, version=1)
            report({{"relu": tree_sha256(snapshot_download({RELU!r}, repo_type="kernel", revision="v1")),
                     "model": tree_sha256(snapshot_download({MODEL!r})),
                     "get_kernel": [k.VERSION, k.REVISION_NOTE, k.VARIANT, k.silu_and_mul(torch.arange(4.)).tolist()]}})
        """
        hf = tmp / f"hf-{len(list(tmp.glob('hf-*')))}"
        p, got = run_client(code, served.url, hf)
        assert got is not None, p.stderr[-2000:]
        out["snapshot_download"] = json.dumps(got, sort_keys=True).encode()
    return out


def _lose_ledger(home: Path, pg_server, url: str | None) -> None:
    if url is None:
        for name in ("ledger.sqlite", "ledger.sqlite-wal", "ledger.sqlite-shm"):
            (home / name).unlink(missing_ok=True)
    else:  # a PostgreSQL made again, empty, under the same name
        pg_server.drop_database(url)
        pg_server.execute(f'CREATE DATABASE "{url.rsplit("/", 1)[1]}" TEMPLATE template1')


def _refused_everywhere(home: Path, manifest: Path, tmp: Path, *pre: str) -> None:
    cases = [
        ["report"],
        ["env", "--target", X86, *(["--into", str(tmp / "into")] if pre else [])],  # an object store: --into
        ["export-cache", str(tmp / "cache"), "--target", X86],
        ["--endpoint", "http://127.0.0.1:9", "stage", str(manifest)],
    ]
    for args in cases:
        p = run_cli(*pre, *args, home=home)
        assert p.returncode == 2 and REBUILD in one_line(p), (args, p.stdout, p.stderr)
    p = run_cli_process(*pre, "serve", "--port", str(free_port()), home=home, timeout=60)
    assert p.returncode == 2 and REBUILD in one_line(p), p.stderr
    assert not (tmp / "cache").exists()


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger(request, monkeypatch):
    """None (SQLite in the home), or (the server, a fresh database's URL) named in FRT_LEDGER_URL."""
    if request.param == "sqlite":
        yield None, None
        return
    server = request.getfixturevalue("pg_server")
    server.start()
    url = server.new_database()
    monkeypatch.setenv("FRT_LEDGER_URL", url)
    yield server, url
    if server.running:
        server.drop_database(url)


def test_every_answer_is_the_same_after_the_ledger_is_lost_and_rebuilt(ledger, tmp_path):
    pg_server, url = ledger
    home = tmp_path / "home"
    manifest = _stage(tmp_path, home)
    before = _answers(home, tmp_path)
    assert before[f"/api/kernels/{ACTIVATION}/revision/v2"].startswith(b"404"), "v2 was unstaged"
    assert before[f"/api/kernels/{RELU}/revision/v1"].startswith(b"200")

    _lose_ledger(home, pg_server, url)
    _refused_everywhere(home, manifest, tmp_path)
    if url is None:  # a 0-byte file, as a failed copy leaves: refused the same way, and left as it was
        (home / "ledger.sqlite").write_bytes(b"")
        p = run_cli("report", home=home)
        assert p.returncode == 2 and REBUILD in one_line(p), p.stderr
        assert (home / "ledger.sqlite").stat().st_size == 0

    p = run_cli("ledger", "rebuild", home=home)
    assert p.returncode == 0, p.stderr
    assert "2 withdrawn" in p.stdout and "tokens" in p.stdout and "not rebuilt" in p.stdout, p.stdout
    assert _answers(home, tmp_path) == before

    again = run_cli("ledger", "rebuild", home=home)
    assert again.returncode == 1 and "is not empty" in one_line(again) and "--force" in one_line(again)
    p = run_cli("ledger", "rebuild", "--force", "--json", home=home)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["withdrawn"] == 2 and {r["requested"] for r in doc["staged"] if r["repo"] == ACTIVATION} == {"v1"}
    # The withdrawal itself came back: an older bundle's import would not stage v2 again.
    p = run_cli("report", "--json", home=home)
    assert p.returncode == 0, p.stderr


def test_a_record_naming_a_missing_blob_writes_nothing(tmp_path):
    home = tmp_path / "home"
    m = write_manifest(tmp_path / "m.toml", {RELU: {"version": 1}}, [X86], trust=[ORG])
    with FakeHub(demo_repos(), trusted_orgs=[ORG], page_size=5) as hub:
        p = run_cli("--endpoint", hub.url, "stage", str(m), home=home)
        assert p.returncode == 0, p.stderr
    gone = next(p for p in sorted((home / "store" / "sha256").glob("??/*")))
    os.chmod(gone.parent, 0o755)
    gone.unlink()
    for name in ("ledger.sqlite", "ledger.sqlite-wal", "ledger.sqlite-shm"):
        (home / name).unlink(missing_ok=True)
    p = run_cli("ledger", "rebuild", home=home)
    assert p.returncode == 1, p.stderr
    line = one_line(p)
    assert gone.name in line and "does not hold it" in line and "nothing was written" in line, line
    assert not (home / "ledger.sqlite").exists()


def test_a_damaged_record_is_one_line_and_writes_nothing(tmp_path):
    home = tmp_path / "home"
    m = write_manifest(tmp_path / "m.toml", {RELU: {"version": 1}}, [X86], trust=[ORG])
    with FakeHub(demo_repos(), trusted_orgs=[ORG], page_size=5) as hub:
        assert run_cli("--endpoint", hub.url, "stage", str(m), home=home).returncode == 0
    record = next((home / "store" / "records").glob("*.json"))
    record.write_bytes(record.read_bytes()[:100])
    (home / "ledger.sqlite").unlink()
    p = run_cli("ledger", "rebuild", home=home)
    assert p.returncode == 1 and record.name in one_line(p) and "not a ledger record" in one_line(p), p.stderr
    assert not (home / "ledger.sqlite").exists()


def test_a_record_past_the_bound_is_refused_unread(tmp_path):
    """A file in records/ bigger than any record a stager writes (here a sparse 17 MiB one) is refused by
    its size in one line, not read into memory whole; nothing is written."""
    home = tmp_path / "home"
    m = write_manifest(tmp_path / "m.toml", {RELU: {"version": 1}}, [X86], trust=[ORG])
    with FakeHub(demo_repos(), trusted_orgs=[ORG], page_size=5) as hub:
        assert run_cli("--endpoint", hub.url, "stage", str(m), home=home).returncode == 0
    record = next((home / "store" / "records").glob("*.json"))
    with open(record, "r+b") as f:
        f.truncate(17 << 20)
    (home / "ledger.sqlite").unlink()
    p = run_cli("ledger", "rebuild", home=home)
    line = one_line(p)
    assert p.returncode == 1 and record.name in line and "over the 16 MiB a record has at most" in line, p.stderr
    assert not (home / "ledger.sqlite").exists()


def test_a_store_without_records_has_nothing_to_rebuild(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    p = run_cli("ledger", "rebuild", home=home)
    assert p.returncode == 2 and "holds no ledger records" in one_line(p), p.stderr
    assert not (home / "ledger.sqlite").exists()


def test_gc_drops_the_record_of_a_row_that_never_committed(tmp_path):
    """A stage cut between its record and its commit leaves a record the ledger does not stage: gc removes it
    (before its blobs), so a later rebuild neither stages the row nor stops at its missing blobs."""
    home = tmp_path / "home"
    m = write_manifest(tmp_path / "m.toml", {RELU: {"version": 1}, ACTIVATION: {"version": 1}}, [X86], trust=[ORG])
    with FakeHub(demo_repos(), trusted_orgs=[ORG], page_size=5) as hub:
        assert run_cli("--endpoint", hub.url, "stage", str(m), home=home).returncode == 0
    records = sorted((home / "store" / "records").glob("*.json"))
    assert len(records) == 2
    with sqlite3.connect(home / "ledger.sqlite") as db:  # the crash: activation's row never committed
        db.execute("DELETE FROM staged WHERE repo_id = ?", (ACTIVATION,))
    p = run_cli("gc", home=home)
    assert p.returncode == 0, p.stderr
    assert len(list((home / "store" / "records").glob("*.json"))) == 1
    for name in ("ledger.sqlite", "ledger.sqlite-wal", "ledger.sqlite-shm"):
        (home / name).unlink(missing_ok=True)
    p = run_cli("ledger", "rebuild", "--json", home=home)
    assert p.returncode == 0, p.stderr
    assert [r["repo"] for r in json.loads(p.stdout)["staged"]] == [RELU]


def test_on_an_object_store_too(pg_server, s3_server, tmp_path, monkeypatch):
    """The store on S3 (a real SeaweedFS), the ledger on PostgreSQL: records under PREFIX/records/, one PUT
    each; the database made again empty; the same answers after the rebuild."""
    pg_server.start()
    s3_server.start()
    url, store = pg_server.new_database(), s3_server.new_prefix()
    monkeypatch.setenv("FRT_LEDGER_URL", url)
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    home = tmp_path / "home"
    manifest = _stage(tmp_path, home, "--store", store)
    env = replica_env(FRT_STORE_URL=store)
    before = _answers(home, tmp_path, env)
    _lose_ledger(home, pg_server, url)
    _refused_everywhere(home, manifest, tmp_path, "--store", store)
    p = run_cli("--store", store, "ledger", "rebuild", home=home)
    assert p.returncode == 0, p.stderr
    assert "2 withdrawn" in p.stdout, p.stdout
    assert _answers(home, tmp_path, env) == before
    pg_server.drop_database(url)


def _staged_rows(home: Path) -> list:
    from frt.mirror.store.home import Home

    h = Home(home)
    try:
        return h.staged()
    finally:
        h.close()


def _lose_and_rebuild(home: Path) -> None:
    for name in ("ledger.sqlite", "ledger.sqlite-wal", "ledger.sqlite-shm"):
        (home / name).unlink(missing_ok=True)
    p = run_cli("ledger", "rebuild", home=home)
    assert p.returncode == 0, p.stderr


def test_what_an_import_staged_is_rebuilt(tmp_path):
    """import writes the records too (inside its one transaction, from the rows it has not committed yet)."""
    a, b = tmp_path / "a", tmp_path / "b"
    m = write_manifest(tmp_path / "m.toml", {RELU: {"version": 1}, LAYERNORM: {"version": 1}}, [X86], trust=[ORG])
    with FakeHub(demo_repos(), trusted_orgs=[ORG], page_size=5) as hub:
        assert run_cli("--endpoint", hub.url, "stage", str(m), home=a).returncode == 0
    assert run_cli("bundle", str(tmp_path / "b.tar"), home=a).returncode == 0
    p = run_cli("import", str(tmp_path / "b.tar"), home=b)
    assert p.returncode == 0, p.stderr
    env = run_cli("env", "--target", X86, "--format", "json", home=b)
    before = _staged_rows(b)
    assert {r.repo for r in before} >= {RELU, LAYERNORM}  # and activation, which layernorm depends on
    shutil.rmtree(b / "views")  # the views lost with the ledger: laid out again from the store
    _lose_and_rebuild(b)
    assert _staged_rows(b) == before
    again = run_cli("env", "--target", X86, "--format", "json", home=b)
    assert again.returncode == 0 and again.stdout == env.stdout, again.stderr
    for path in json.loads(again.stdout)["env"]["LOCAL_KERNELS"].split(":"):
        assert Path(path.split("=", 1)[1]).is_dir(), path


def test_what_pull_through_staged_is_rebuilt(tmp_path):
    home = tmp_path / "home"
    code = f"""
        from huggingface_hub import snapshot_download
        report(sorted(tree_sha256(snapshot_download({RELU!r}, repo_type="kernel", revision="v1"))))
    """
    with FakeHub(demo_repos(), trusted_orgs=[ORG], page_size=5) as hub:
        with serving(home, "--upstream", hub.url, "--allow", ORG, env=serve_env()) as served:
            p, got = run_client(code, served.url, tmp_path / "hf")
            assert got, p.stderr[-2000:]
    before = _staged_rows(home)
    assert before and all(r.is_pulled for r in before), before
    _lose_and_rebuild(home)
    assert _staged_rows(home) == before
