"""A target's variant folders written out of an object store (`env --target T --into DIR` on `--store
s3://…`): LOCAL_KERNELS needs files, and an object store's home has no views.

Each variant goes to DIR/<org>--<name>/<commit>/build/<variant>/ as a view would (so LOCAL_KERNELS reads
the same), its wheels to DIR/wheels/. Each file is streamed from its object and hashed as it is written;
the folder is assembled beside the others and renamed into place whole, and only if every file hashed to
its blob's name: a half-written or damaged folder is never what LOCAL_KERNELS points at. A folder already
there, complete by size, is kept (a second env run writes nothing).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path

from frt.resolver.errors import VerificationFailed

from ..store.home import Home
from ..store.records import StagedRow, blob_for, wheel_rows
from ..store.view_trees import repo_folder

# A folder's files: (path under it, size, the sha256 of its blob; None where no verified blob is recorded).
Files = Sequence[tuple[str, int, str | None]]


def materialise(home: Home, rows: list[StagedRow], into: Path) -> dict[tuple[str, str, str], Path]:
    """Each row's variant folder under `into`, written (or found complete); (repo, commit, variant) -> it."""
    out = {}
    with home.ledger.view() as v:
        listings = {(r.repo, r.commit, r.variant): v.variant(r.repo, r.commit, r.variant)[0] for r in rows}
    blobs = blob_for(home.ledger, (f for files in listings.values() for f in files))
    for (repo, commit, variant), files in listings.items():
        final = into / repo_folder(repo) / commit / "build" / variant
        prefix = f"build/{variant}/"
        wanted = [(f.path[len(prefix) :] if f.path.startswith(prefix) else f.path, f.size, blobs[f]) for f in files]
        if not _complete(final, wanted):
            _write(home, final, wanted, into / ".tmp")
        out[(repo, commit, variant)] = final
    needed = sorted({w for r in rows for w in r.wheels})
    if needed:
        folder = into / "wheels"
        _write(
            home,
            folder,
            [(name, size, sha) for name, (_p, _v, sha, size) in wheel_rows(home.ledger, needed).items()],
            into / ".tmp",
            merge=True,
        )
    return out


def fetch_blob(home: Home, sha: str, dest: Path, what: str) -> None:
    """`dest` written with blob `sha`'s bytes from the store, hashed as they come; VerificationFailed (and
    the file left for the caller's scratch folder to take away) when they are not that blob's."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    with open(dest, "wb") as out:
        for chunk in home.store.stream(sha):
            h.update(chunk)
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())
    if h.hexdigest() != sha:
        raise VerificationFailed(
            f"{what}: the store's object for blob {sha} hashes to {h.hexdigest()}: "
            "not written ('frt-mirror verify' names what is damaged)"
        )


def _complete(folder: Path, wanted: Files) -> bool:
    try:
        return all((folder / rel).stat().st_size == size for rel, size, _ in wanted)
    except FileNotFoundError:
        return False


def _write(home: Home, final: Path, wanted: Files, tmp: Path, merge: bool = False) -> None:
    tmp.mkdir(parents=True, exist_ok=True)
    scratch = tmp / uuid.uuid4().hex
    try:
        for rel, size, sha in wanted:
            if sha is None:
                raise VerificationFailed(f"{final}/{rel}: no verified blob is recorded for it")
            if merge and (final / rel).is_file() and (final / rel).stat().st_size == size:
                continue
            fetch_blob(home, sha, scratch / rel, f"{final}/{rel}")
        final.parent.mkdir(parents=True, exist_ok=True)
        if merge:
            final.mkdir(exist_ok=True)
            for p in scratch.rglob("*"):
                if p.is_file():
                    os.replace(p, final / p.relative_to(scratch))
        else:
            if final.exists():  # incomplete: set aside, then replaced whole
                shutil.rmtree(final)
            os.rename(scratch, final)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
