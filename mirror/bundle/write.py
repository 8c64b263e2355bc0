"""bundle: write the staged set (or, with `since`, what is new since an earlier bundle) as one tar."""

from __future__ import annotations

import io
import json
import tarfile
import time
from pathlib import Path
from typing import Any

import frt
from frt.resolver.errors import BadInput
from frt.resolver.fs import atomic_file
from frt.resolver.ledger.io import repo_record
from frt.resolver.ledger.migrations import utcnow

from ..events import record_event
from ..stage.progress import Progress
from ..store.blobs import Digest
from ..store.home import Home
from ..store.protocol import BlobStore
from ..store.records import StagedRow, all_blobs, blob_for, staged_rows, wheel_rows
from .format import (
    FORMAT,
    MANIFEST,
    READS,
    SIGNATURE,
    UNSTAGES,
    WHEELS,
    BundleRejected,
    BundleReport,
    Hashing,
    bundle_id,
    read_head,
)
from .signing import key_id, load_private
from .signing import sign as sign_manifest
from .state import Base, cumulative_state, delta, unstaged_since


def bundle(
    out: Path,
    home: Home,
    targets: list[str] | None = None,
    *,
    since: Path | None = None,
    sign: Path | None = None,
    progress: bool = False,
    replace: bool = False,
) -> BundleReport:
    """Write OUT: a full bundle of what is staged (for `targets`, default all), or with `since` an
    incremental one that carries only the blobs and records PREV (and its bases) do not, naming
    PREV as its base. With `sign`, a private key's signature over the manifest travels with it.
    An existing OUT is replaced only with `replace`: it may be the --since base of a later bundle."""
    if not replace and (out.exists() or out.is_symlink()):
        raise _exists(out)
    key = load_private(sign) if sign else None  # a bad key is refused before any work
    base = _read_base(since) if since else None
    rows = _rows(home, targets)
    if not out.parent.is_dir():
        raise BadInput(f"{out.parent} is not a directory")
    doc, blobs = _full_doc(home, rows)
    gone = []
    if base is not None:
        gone = unstaged_since(base["state"], doc["staged"], targets)
        doc.update(delta(doc, base["state"]), base=base)
        if gone:
            doc.update(format=UNSTAGES, unstaged=gone)
        carried = {b["sha256"] for b in doc["blobs"]}
        blobs = [d for d in blobs if d.sha256 in carried]
        rows = [StagedRow(**s) for s in doc["staged"]]
    needed = {w for r in rows for w in r.wheels}
    doc["wheels"] = [w for w in doc["wheels"] if w["filename"] in needed]
    if doc["wheels"]:
        doc["format"] = WHEELS
    else:
        del doc["wheels"]  # a bundle without wheels reads as it did before them
    manifest = json.dumps(doc, indent=1, sort_keys=True).encode()
    signature = sign_manifest(manifest, key) if key else None
    meter = Progress(sum(d.size for d in blobs), len(blobs), label="bundle") if progress else None
    try:
        _write_tar(out, manifest, signature, blobs, home.store, meter, exclusive=not replace)
    except FileExistsError:  # another writer's OUT landed while this one was written: theirs stays
        raise _exists(out) from None
    finally:
        if meter:
            meter.close()
    report = BundleReport(
        out,
        len(blobs),
        sum(d.size for d in blobs),
        rows,
        id=bundle_id(manifest),
        base=base["id"] if base is not None else None,
        base_name=base["name"] if base is not None else None,
        signed_by=key_id(key.public_key()) if key is not None else None,
        unstaged=gone,
    )
    if not home.ledger.readonly:  # a cluster's read-only home bundles too, and keeps no record of it
        record_event(
            home.ledger,
            "bundle",
            ref=report.id,
            base=report.base,
            files=report.blobs,
            nbytes=report.bytes,
            detail=str(out),
        )
    return report


def _rows(home: Home, targets: list[str] | None) -> list[StagedRow]:
    rows = staged_rows(home.ledger)
    for t in targets or []:
        if not any(r.target == t for r in rows):
            raise BadInput(f"nothing is staged for {t}: run 'frt-mirror stage --target {t}' first")
    rows = [r for r in rows if not targets or r.target in targets or r.is_model]  # models: every target's
    if not rows:
        raise BadInput("nothing is staged: run 'frt-mirror stage' first")
    return rows


def _read_base(prev: Path) -> Base:
    """PREV's id and state, from its manifest alone (its blobs are not read: PREV may be a copy kept
    on the connected box, and only its description matters here)."""
    try:
        with tarfile.open(prev, mode="r:") as tf:
            manifest = read_head(tf, iter(tf))[0]
        doc = json.loads(manifest)
        if doc["format"] not in READS:
            raise ValueError(f"bundle format {doc['format']!r}")
        state = cumulative_state(doc)
    except (tarfile.TarError, EOFError, BundleRejected, ValueError, KeyError, TypeError) as e:
        raise BadInput(f"--since {prev}: not a bundle this frt-mirror reads ({type(e).__name__}: {e})") from None
    return {"id": bundle_id(manifest), "name": prev.name, "created": doc.get("created"), "state": state}


def _full_doc(home: Home, rows: list[StagedRow]) -> tuple[dict[str, Any], list[Digest]]:
    """The manifest of a full bundle of `rows`, and the blobs it lists, each checked to be stored."""
    ledger, store = home.ledger, home.store
    recorded = {d.sha256: d for d in all_blobs(ledger)}
    with ledger.view() as v:
        files = {(r.repo, r.commit, r.variant): v.variant(r.repo, r.commit, r.variant)[0] for r in rows}
    blobs = blob_for(ledger, (f for fs in files.values() for f in fs))
    needed: dict[str, Digest] = {}
    for (repo, commit, _), entries in files.items():
        for f in entries:
            sha = blobs[f]
            if sha not in recorded or not store.has(sha):
                raise BundleRejected(
                    f"{repo}@{commit[:12]}: {f.path} has no verified blob in the store: "
                    "run 'frt-mirror verify', then 'frt-mirror stage' again"
                )
            needed[sha] = recorded[sha]
    wheels = wheel_rows(ledger, {w for r in rows for w in r.wheels})
    for name in sorted({w for r in rows for w in r.wheels}):
        sha = wheels.get(name, (None, None, None, None))[2]
        if sha is None or sha not in recorded or not store.has(sha):
            raise BundleRejected(
                f"wheel {name} has no verified blob in the store: run 'frt-mirror verify', then "
                "'frt-mirror stage' again"
            )
        needed[sha] = recorded[sha]
    listed = [needed[k] for k in sorted(needed)]
    doc = {
        "format": FORMAT,
        "created": utcnow().isoformat(),
        "frt_mirror": frt.version(),
        "blobs": [{"sha256": d.sha256, "size": d.size, "git_oid": d.git_oid} for d in listed],
        "repos": [repo_record(ledger, repo) for repo in sorted({r.repo for r in rows})],
        "staged": [r.to_json() for r in rows],
        # The wheels of python-depends the rows name (their blobs are listed above, or in the base).
        "wheels": [
            {"filename": f, "project": p, "version": v, "sha256": sha, "size": size}
            for f, (p, v, sha, size) in sorted(wheels.items())
        ],
        # The upstream's trustedKernelPublisher per org, so `serve` on the other side repeats it.
        "publishers": [p.to_json() for p in ledger.publishers({r.repo.split("/", 1)[0] for r in rows}).values()],
    }
    return doc, listed


def _exists(out: Path) -> BadInput:
    return BadInput(f"{out} exists: bundle does not replace it (it may be a later bundle's --since base); --force does")


def _write_tar(
    out: Path,
    manifest: bytes,
    signature: bytes | None,
    blobs: list[Digest],
    store: BlobStore,
    meter: Progress | None,
    *,
    exclusive: bool,
) -> None:
    mtime = int(time.time())

    def info(name: str, size: int) -> tarfile.TarInfo:
        ti = tarfile.TarInfo(name)
        ti.size, ti.mtime, ti.mode = size, mtime, 0o444
        return ti

    # Plain tar, no compression: kernels are mostly compiled .so files that barely compress,
    # and an uncompressed tar streams at disk speed on both sides of the gap.
    with atomic_file(out, exclusive=exclusive) as f, tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as tf:
        tf.addfile(info(MANIFEST, len(manifest)), io.BytesIO(manifest))  # first: read before any blob
        if signature is not None:  # second: checked before any blob is read
            tf.addfile(info(SIGNATURE, len(signature)), io.BytesIO(signature))
        for d in blobs:
            add, done = meter.file(d.sha256[:16], d.size) if meter is not None else (None, None)
            try:
                with store.open(d.sha256) as src:
                    reader = Hashing(src, d.size, add)
                    tf.addfile(info(f"blobs/{d.sha256}", d.size), reader)
            finally:
                if done:
                    done(False)  # counted below, once its digest held
            if reader.digest() != d:  # better caught here, where it can be re-staged
                raise BundleRejected(f"stored blob {d.sha256} is corrupt: run 'frt-mirror verify'")
            if meter:
                meter.file_done()
