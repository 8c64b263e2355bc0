"""Bundles as an operator carries them across the air gap: written on the connected box, imported with
no network, and compared byte for byte; `rewrite` forges one member by member. The staged home A and an
importing home B that already holds something are fixtures in tests/conftest.py (home_a, b_with_x86)."""

from __future__ import annotations

import io
import json
import sqlite3
import tarfile
from pathlib import Path

from tests.support.cli import run_cli
from tests.support.offline import NO_NET


def make_bundle(home: Path, out: Path, *targets: str) -> dict:
    p = run_cli("bundle", str(out), "--json", *[a for t in targets for a in ("--target", t)], home=home)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def import_offline(home: Path, bundle: Path, *extra: str):
    return run_cli("import", str(bundle), *extra, home=home, wrap=NO_NET)


def snapshot(home: Path) -> tuple:
    """Everything an import could change: every file under the home (but the ledger's own
    files, compared as a full SQL dump instead) with its size, and the ledger's contents."""
    files = sorted(
        (str(p.relative_to(home)), p.stat().st_size)
        for p in home.rglob("*")
        if p.is_file() and not p.name.startswith("ledger.sqlite")
    )
    if not (home / "ledger.sqlite").exists():
        return files, None
    with sqlite3.connect(home / "ledger.sqlite") as db:
        return files, list(db.iterdump())


def snapshot_data(home: Path) -> tuple:
    """snapshot but for locks/: the store lock's file, created empty by the first command that takes the
    lock (import takes it before it reads the bundle), holds no data of any bundle."""
    files, dump = snapshot(home)
    return [f for f in files if not f[0].startswith("locks/")], dump


def rewrite(src: Path, dst: Path, edit) -> None:
    """Copy a tar member by member; `edit(info, data)` returns [(info, data)] to write instead."""
    with tarfile.open(src) as tin, tarfile.open(dst, "w") as tout:
        for m in tin:
            for info, data in edit(m, tin.extractfile(m).read()):
                tout.addfile(info, io.BytesIO(data) if data is not None else None)


def edit_manifest(change):
    """A `rewrite` edit that applies `change(doc)` to frt-bundle.json's document (a forger's edit: the
    manifest is left unsigned) and copies every other member as it is."""

    def edit(m, data):
        if m.name == "frt-bundle.json":
            doc = json.loads(data)
            change(doc)
            data = json.dumps(doc).encode()
            m.size = len(data)
        return [(m, data)]

    return edit
