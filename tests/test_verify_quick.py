"""`verify` on a small home reads the ledger with sqlite3 alone (store/verify_reads.py), as `env` and `report`
do (issue "Start-up, import and the S3 store at disk speed": a command that opens the ledger pays only for
what it uses): the same records as the ledger's own reader, the same report, without SQLAlchemy or
huggingface_hub; and the ledger's own path wherever the file is not exactly this code's schema."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from frt.mirror.event_rows import QUARANTINE
from frt.mirror.events import record_event
from frt.mirror.home_path import MIRROR_VERSION
from frt.mirror.store.home import Home
from frt.mirror.store.records import all_blobs
from frt.mirror.store.staged import QUICK_TABLES, QUICK_VERSIONS
from frt.mirror.store.verify import verify
from frt.mirror.store.verify_reads import ledger_records, read_records
from frt.resolver.ledger_file import SCHEMA_VERSION, quick_read
from tests.support.cli import X86, run_cli
from tests.support.fakehub import FakeHub, FakeRepo
from tests.support.kernel_fixtures import LAYERNORM, ORG, RELU, blob, demo_repos, einsum_repo
from tests.support.startup import loaded_after
from tests.support.wheel_index import LocalIndex, make_wheel

MODEL = "acme/tiny"
EINSUM = f"{ORG}/einsum"
NOT_LOADED = ("sqlalchemy", "huggingface_hub")


@pytest.fixture(scope="module")
def staged(tmp_path_factory) -> Path:
    """A home with kernels (layernorm brings activation; einsum's python-depends bring a wheel), a model's
    selected files, and serve's quarantine event on one blob."""
    root = tmp_path_factory.mktemp("verify-quick")
    home, index = root / "home", root / "index"
    make_wheel(index, "einops", "0.8.1", {"einops/__init__.py": '__version__ = "0.8.1"\n'})
    model = FakeRepo(MODEL, repo_type="model")
    files = {"config.json": b'{"layers": 2}\n', "model.safetensors": blob("tiny", 40_000), "README.md": b"# m\n"}
    model.commit(files, title="a tiny model")
    kernels = "\n".join(f'"{r}" = {{ version = 1 }}' for r in (LAYERNORM, RELU, EINSUM))
    manifest = root / "m.toml"
    manifest.write_text(
        f'[[targets]]\ntarget = "{X86}"\n\n[kernels]\n{kernels}\n\n'
        f'[models]\n"{MODEL}" = {{ revision = "main", include = ["*.json", "*.safetensors"] }}\n'
    )
    with FakeHub([*demo_repos(), einsum_repo(), model], trusted_orgs=[ORG]) as hub, LocalIndex(index) as wheels:
        p = run_cli("--endpoint", hub.url, "stage", str(manifest), "--wheel-index", wheels.url, "--json", home=home)
    assert p.returncode == 0, p.stderr
    h = Home(home)
    try:
        d = all_blobs(h.ledger)[0]
        record_event(h.ledger, QUARANTINE, ref=d.sha256, files=1, nbytes=d.size, detail="read back changed")
    finally:
        h.close()
    return home


def ledgers_verify(home: Path) -> dict:
    """verify's report through the ledger's own reader (the ledger opened first, so no quick read)."""
    h = Home(home)
    try:
        assert h.ledger is not None
        return verify(h).to_json()
    finally:
        h.close()


def test_the_quick_reader_reads_what_the_ledgers_reader_reads(staged):
    quick = Home(staged).quick(read_records)
    h = Home(staged, readonly=True)
    try:
        slow = ledger_records(h.ledger)
    finally:
        h.close()
    assert quick == slow
    # Every kind of record verify reads is there to compare.
    assert {r.repo for r in slow.staged} >= {LAYERNORM, RELU, EINSUM, MODEL}
    assert slow.wheels and all(r.wheels for r in slow.staged if r.repo == EINSUM)
    assert [e.detail for e in slow.quarantined.values()] == ["read back changed"]
    assert all(files for files, _ in slow.variants.values())
    assert any("digest" in doc for _, doc in slow.variants.values())


def test_verify_imports_neither_sqlalchemy_nor_huggingface_hub_and_says_what_the_ledgers_path_says(staged):
    p, loaded = loaded_after(["--home", str(staged), "verify", "--json"])
    assert p.returncode == 0, p.stderr
    assert not set(loaded["heavy"]) & set(NOT_LOADED), loaded["heavy"]
    # kernels' compiled digest code, without its package (whose __init__ imports huggingface_hub)
    assert "kernels._rust" in loaded["modules"] and "kernels" not in loaded["modules"]
    got = json.loads(p.stdout)
    assert got == ledgers_verify(staged)
    assert got["ok"] and got["model_files"] == 2 and got["wheels"] == 1 and got["view_files"] > 0


def _copy(home: Path, to: Path) -> Path:
    # cp -a keeps the views' hard links into the store (shutil.copytree would make them copies)
    subprocess.run(["cp", "-a", str(home), str(to)], check=True)
    return to


def test_a_corrupt_blob_is_reported_through_the_quick_path(staged, tmp_path):
    home = _copy(staged, tmp_path / "home")
    h = Home(home, readonly=True)
    try:
        [sha] = [e.ref for e in ledger_records(h.ledger).quarantined.values()]
    finally:
        h.close()
    bad = home / "store" / "sha256" / sha[:2] / sha
    os.chmod(bad, 0o644)
    bad.write_bytes(b"x" + bad.read_bytes()[1:])
    p, loaded = loaded_after(["--home", str(home), "verify", "--json"])
    assert p.returncode == 1, p.stderr
    assert not set(loaded["heavy"]) & set(NOT_LOADED), loaded["heavy"]
    got = json.loads(p.stdout)
    assert any(x.startswith(f"corrupt blob {sha}") and "serve quarantined it at" in x for x in got["problems"])
    assert got == ledgers_verify(home)
    text = run_cli("verify", home=home)
    assert text.returncode == 1 and f"  corrupt blob {sha}" in text.stdout


def test_blobs_to_adopt_open_the_ledger_then_and_are_recorded(staged, tmp_path):
    home = _copy(staged, tmp_path / "home")
    data = b"an unrecorded but intact blob\n"
    sha = hashlib.sha256(data).hexdigest()
    (home / "store" / "sha256" / sha[:2]).mkdir(exist_ok=True)
    (home / "store" / "sha256" / sha[:2] / sha).write_bytes(data)
    p, loaded = loaded_after(["--home", str(home), "verify", "--json"])
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["adopted"] == 1 and "sqlalchemy" in loaded["heavy"]  # the one write
    p, loaded = loaded_after(["--home", str(home), "verify", "--json"])
    assert p.returncode == 0 and json.loads(p.stdout)["adopted"] == 0, p.stderr
    assert "sqlalchemy" not in loaded["heavy"]


@pytest.mark.parametrize(
    "change",
    [
        f"INSERT INTO mirror_schema_migrations (version, applied_at) VALUES ({MIRROR_VERSION + 1}, '2030-01-01')",
        f"UPDATE mirror_schema_migrations SET version = {MIRROR_VERSION - 1} WHERE version = {MIRROR_VERSION}",
        f"INSERT INTO schema_migrations (version, applied_at) VALUES ({SCHEMA_VERSION + 1}, '2030-01-01')",
        f"UPDATE schema_migrations SET version = {SCHEMA_VERSION - 1} WHERE version = {SCHEMA_VERSION}",
        "DROP TABLE mirror_events",
        "DROP TABLE files",
    ],
)
def test_the_quick_read_gives_way_where_the_schema_is_not_this_codes(staged, tmp_path, change):
    ledger = tmp_path / "ledger.sqlite"
    shutil.copy(staged / "ledger.sqlite", ledger)
    assert quick_read(ledger, QUICK_VERSIONS, QUICK_TABLES, read_records) is not None
    with sqlite3.connect(ledger) as con:
        con.execute(change)
    assert quick_read(ledger, QUICK_VERSIONS, QUICK_TABLES, read_records) is None


def test_verify_of_a_ledger_to_migrate_takes_the_ledgers_path(staged, tmp_path):
    """A writable home at an older schema: the quick read gives way, and the ledger's own open migrates it."""
    home = _copy(staged, tmp_path / "home")
    with sqlite3.connect(home / "ledger.sqlite") as con:
        con.execute(
            "UPDATE mirror_schema_migrations SET version = ? WHERE version = ?", (MIRROR_VERSION - 1, MIRROR_VERSION)
        )
    p, loaded = loaded_after(["--home", str(home), "verify", "--json"])
    assert p.returncode == 0 and json.loads(p.stdout)["ok"], p.stderr
    assert "sqlalchemy" in loaded["heavy"]
    with sqlite3.connect(home / "ledger.sqlite") as con:
        assert con.execute("SELECT max(version) FROM mirror_schema_migrations").fetchone() == (MIRROR_VERSION,)
