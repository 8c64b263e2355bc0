"""import: verify a bundle in full, then add it to the store, the ledger and the views.

Import trusts nothing in the archive. In order, before anything is written: the signature over the
manifest (with `require_signature`), the manifest's content (frt.mirror.bundle.check), an incremental
bundle's base (the home must hold it: frt.mirror.bundle.state), then every blob member, streamed into
tmp/ and hashed. Only when all of them match does anything enter the store, the ledger or the views.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import tarfile
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import NoReturn, cast

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from frt.resolver.errors import BadInput
from frt.resolver.ledger import Ledger
from frt.resolver.ledger.retry import retried
from frt.resolver.resolution import FileEntry

from ..events import events_with_ref, record_event
from ..stage.progress import Progress
from ..store.blobs import Digest
from ..store.home import Home
from ..store.protocol import BlobStore
from ..store.records import (
    StagedRow,
    blob_for,
    delete_staged,
    record_blobs,
    record_staged_rows,
    staged_rows,
)
from ..store.unstage import drop_views
from ..store.withdrawn import forget_withdrawn, withdrawn_after
from .check import Manifest, check_manifest
from .extract import all_or_none, copiers, verify_member
from .format import (
    BLOB,
    MANIFEST,
    REGULAR,
    SIGNATURE,
    BundleRejected,
    BundleReport,
    bundle_id,
    read_head,
)
from .merge import merge_manifest
from .signing import check as check_signature
from .signing import key_id, load_public
from .state import base_refusal, missing_here, without


def import_bundle(
    src: Path,
    home: Home,
    *,
    require_signature: Path | None = None,
    progress: bool = False,
    allow_rollback: bool = False,
) -> BundleReport:
    """`allow_rollback`: also stage again the rows this home withdrew after the bundle was written (store/withdrawn.py);
    without it they are skipped, and the report names them."""
    key = load_public(require_signature) if require_signature else None  # bad input: before any read
    _load_beside("frt.resolver.variants")  # the ledger's variant rows, last, parse names with kernels' own parser
    ledger, store = home.ledger, home.store
    parts: dict[str, Path | None] = {}  # sha -> its .part in tmp/ (None: already in the store)
    try:
        got = _read_and_verify(src, home, key, parts, progress)
    except BaseException as e:
        _remove_parts(parts)
        _reject(src, e)
    m, ident, signer = got
    skip = set() if allow_rollback else _withdrawn_since(ledger, m)
    # Everything verified: the store, then the views (files no ledger row points at yet), then every
    # ledger row in one transaction, so a failure there leaves the ledger as it was and a rerun
    # completes the import (blobs and views already in place are kept, not redone).
    store.commit_synced([(part, m.listed[sha]) for sha, part in parts.items() if part is not None])
    if (views := home.views) is not None:  # an object store's home has none
        # Every row's pairs are whole by now (check_manifest's, or for an incremental bundle _pair_from_home's).
        paired = cast("list[tuple[StagedRow, list[tuple[FileEntry, str]]]]", m.staged)
        for row, pairs in paired:
            if not row.is_model and row.key not in skip:  # models have no view (frt.mirror.stage.models)
                views.link(row.repo, row.commit, row.variant, pairs)
        views.link_wheels(m.wheels)
    report, gone = ledger.retrying(_record_import, ledger, src, m, ident, signer, parts, skip, store)
    if gone:  # after the commit: a view that no row names any more is only files
        drop_views(home, gone)
    return report


def _remove_parts(parts: dict[str, Path | None]) -> None:
    for p in parts.values():
        if p is not None:
            p.unlink(missing_ok=True)


def _reject(src: Path, e: BaseException) -> NoReturn:
    """An import that failed before the store took anything: a bad bundle's one line; anything else as is."""
    why: BaseException | str = e
    if isinstance(e, (tarfile.TarError, EOFError)):
        why = f"truncated or not a tar archive ({e})"
    elif not isinstance(e, (BundleRejected, OSError)):
        raise e
    raise BundleRejected(f"{src}: {why}; nothing was imported") from None


def _load_beside(module: str) -> None:
    """Import `module` on a thread of its own while the bundle is read: importing kernels (and the
    huggingface_hub it brings) holds the interpreter about a third of a second, and the copy and the hashes
    release it, so on a box with two cores the import costs the command nothing. Its errors are left to the
    import that needs it (a thread's would be a traceback on stderr)."""

    def load() -> None:
        with contextlib.suppress(BaseException):
            importlib.import_module(module)

    # Not a daemon: the interpreter waits for it to end before it exits (a refused bundle's exit comes
    # sooner). A daemon thread still importing a compiled extension as the interpreter went down aborted
    # the process ("FATAL: exception not rethrown", SIGABRT) instead of its exit 1.
    threading.Thread(target=load, name=f"import {module}").start()


def _withdrawn_since(ledger: Ledger, m: Manifest) -> set[tuple[str, str, str]]:
    """The keys of the bundle's rows this home does not stage and withdrew after the bundle was written."""
    if m.created is None:  # written before bundles said when: nothing to compare
        return set()
    staged = {r.key for r in staged_rows(ledger)}
    return set(withdrawn_after(ledger, (r.key for r, _ in m.staged if r.key not in staged), m.created))


def _record_import(
    ledger: Ledger,
    src: Path,
    m: Manifest,
    ident: str,
    signer: str | None,
    parts: dict[str, Path | None],
    skip: set[tuple[str, str, str]],
    store: BlobStore,
) -> tuple[BundleReport, list[StagedRow]]:
    """Every ledger row of the import, in one transaction: a unit that a dropped connection re-runs whole
    (Ledger.retrying), and a failure leaves the ledger as it was."""
    with ledger.transaction():
        record_blobs(ledger, m.listed.values())
        merge_manifest(ledger, m)
        have = set(staged_rows(ledger))
        skipped = [row for row, _ in m.staged if row.key in skip]
        new = [row for row, _ in m.staged if row not in have and row.key not in skip]
        record_staged_rows(ledger, new, store=store)
        with ledger.session() as s:
            forget_withdrawn(s, (r.key for r in new))
        taken = set(m.unstaged)
        gone = [r for r in have if r.key in taken]
        delete_staged(ledger, gone, store=store, at=m.created)
        new_blobs = sum(p is not None for p in parts.values())
        report = BundleReport(
            src,
            len(m.listed),
            sum(d.size for d in m.listed.values()),
            [r for r, _ in m.staged],
            id=ident,
            base=m.base["id"] if m.base is not None else None,
            base_name=m.base.get("name") if m.base is not None else None,
            signed_by=signer,
            new_blobs=new_blobs,
            new_rows=len(new),
            unstaged=sorted(list(r.key) for r in gone),
            skipped=skipped,
        )
        # Once per bundle and home: a repeated import that adds nothing leaves the home as it was.
        if new or gone or new_blobs or not events_with_ref(ledger, "import", ident):
            record_event(
                ledger,
                "import",
                ref=ident,
                base=report.base,
                files=new_blobs,
                nbytes=report.bytes,
                detail=str(src),
            )
    return report, gone


def _read_and_verify(
    src: Path,
    home: Home,
    key: Ed25519PublicKey | None,
    parts: dict[str, Path | None],
    progress: bool,
) -> tuple[Manifest, str, str | None]:
    """Returns the checked manifest (every staged row's files paired with blobs), the bundle's id and
    the key id that signed it (None: unsigned)."""
    with open(src, "rb") as raw, tarfile.open(fileobj=raw, mode="r:") as tf:
        members = iter(tf)
        manifest, signature, first_blob = read_head(tf, members)
        signer = _check_signature(manifest, signature, key)
        try:
            m = check_manifest(json.loads(manifest))
        except BadInput as e:  # the gate's line names the value and where it sits
            raise BundleRejected(f"malformed {MANIFEST}: {e}") from None
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
            raise BundleRejected(f"malformed {MANIFEST}: {type(e).__name__}: {e}") from None
        if m.base is not None:
            if missing := missing_here(without(m.base["state"], m.unstaged), home):
                raise BundleRejected(base_refusal(m.base, missing, home))
            _pair_from_home(m, home)
            if lost := [w.filename for w in m.wheels if w.sha256 not in m.listed and not home.store.has(w.sha256)]:
                raise BundleRejected(f"wheels {', '.join(lost)} are neither in the bundle nor in this home")
        blobs = _blob_members(tf, [first_blob] if first_blob else [], members, m.listed)
        home.store.scratch.sweep_parts("*.import-*.part")  # left by a killed import; a running one's are recent
        meter = Progress(sum(d.size for d in m.listed.values()), len(m.listed), label="import") if progress else None
        # Members are copied on one thread per core, biggest first (so the last to finish is a small one);
        # each part is fsynced on a helper thread while other members are read and hashed: by the time
        # the store takes them (commit_synced), their bytes are on disk, without a wait per file here.
        fd, store = raw.fileno(), home.store  # the blobs are read from the descriptor tarfile reads
        by_size = sorted(blobs, key=lambda pair: -pair[0].size)
        with (
            ThreadPoolExecutor(max_workers=4, thread_name_prefix="frt-fsync") as syncer,
            ThreadPoolExecutor(max_workers=copiers(), thread_name_prefix="frt-import") as pool,
        ):
            synced: list[Future[None]] = []
            try:
                all_or_none(
                    [
                        pool.submit(verify_member, fd, mem, want, parts, store, meter, syncer, synced)
                        for mem, want in by_size
                    ]
                )
            finally:
                if meter:
                    meter.close()
            for f in synced:
                f.result()  # an fsync that failed (EIO) fails the import before the store sees it
    return m, bundle_id(manifest), signer


def _blob_members(
    tf: tarfile.TarFile, first: list[tarfile.TarInfo], rest: Iterator[tarfile.TarInfo], listed: dict[str, Digest]
) -> list[tuple[tarfile.TarInfo, Digest]]:
    """Every blob member's header, held to the manifest before a byte of any is written: a regular
    `blobs/<sha256>` file the manifest lists, once, of exactly the listed size, not sparse (its holes
    would be written out: a 10 KiB member stood for a 2 GiB file); none missing; the end-of-archive
    marker there. Reading the headers seeks over the members' data: it costs no read of it. Each member
    with its listed digest."""
    pairs: list[tuple[tarfile.TarInfo, Digest]] = []
    seen: set[str] = set()
    for mem in [*first, *rest]:
        match = BLOB.fullmatch(mem.name)
        if match is None or mem.type not in REGULAR:
            raise BundleRejected(
                f"unexpected member {mem.name!r} (only regular files {MANIFEST}, {SIGNATURE}, blobs/<sha256>)"
            )
        sha = match[1]
        if sha not in listed or sha in seen:
            raise BundleRejected(f"blob {sha} " + ("appears twice" if sha in seen else f"is not in {MANIFEST}"))
        if mem.issparse():
            raise BundleRejected(f"blob {sha} is a sparse member (GNU sparse headers); a bundle carries whole files")
        if mem.size != listed[sha].size:
            raise BundleRejected(f"blob {sha} is {mem.size} bytes in the archive, listed as {listed[sha].size}")
        seen.add(sha)
        pairs.append((mem, listed[sha]))
    if missing := sorted(set(listed) - seen):
        raise BundleRejected(f"{len(missing)} listed blob(s) missing from the archive, e.g. {missing[0]}")
    # A tar cut off exactly between members reads as complete: require its end-of-archive marker.
    tf.fileobj.seek(tf.offset)
    if tf.fileobj.read(2 * tarfile.BLOCKSIZE) != bytes(2 * tarfile.BLOCKSIZE):
        raise BundleRejected("no end-of-archive marker: the archive is truncated")
    return pairs


def _check_signature(manifest: bytes, signature: bytes | None, key: Ed25519PublicKey | None) -> str | None:
    """Without a required key a signature is carried along unchecked (and its key id reported as
    claimed); with one, an unsigned or otherwise-signed bundle is refused before its manifest is read."""
    if key is None:
        if signature is None:
            return None
        with contextlib.suppress(ValueError, KeyError, TypeError):
            return str(json.loads(signature)["key_id"])
        return None
    if signature is None:
        raise BundleRejected(f"the bundle is not signed (no {SIGNATURE}), and --require-signature was given")
    if problem := check_signature(manifest, signature, key):
        raise BundleRejected(problem)
    return key_id(key)


def _pair_from_home(m: Manifest, home: Home) -> None:
    """An incremental bundle's staged rows may use build listings and blobs only its base carried: find
    them in this home (which holds the base), so the views are linked as after a full import."""
    by_oid = {d.git_oid: d.sha256 for d in m.listed.values()}
    listed = _listings(home.ledger, [row for row, pairs in m.staged if pairs is None])
    staged: list[tuple[StagedRow, list[tuple[FileEntry, str | None]]]] = []
    for row, pairs in m.staged:
        if pairs is None:  # as check pairs a carried listing: LFS files by sha256, others by oid
            pairs = [
                (f, (f.sha256 if f.sha256 in m.listed else None) if f.sha256 else by_oid.get(f.git_oid))
                for f in listed[row]
            ]
        staged.append((row, pairs))
    here = blob_for(home.ledger, (f for _, pairs in staged for f, sha in pairs if sha is None))
    for i, (row, pairs) in enumerate(staged):
        out: list[tuple[FileEntry, str | None]] = []
        for f, sha in pairs:
            if sha is None:  # not carried: the base's, so this home's
                sha = here.get(f)
                if sha is None or not home.store.has(sha):
                    raise BundleRejected(f"{row.repo}: {f.path} has no blob in the bundle nor in this home")
            out.append((f, sha))
        if not out:
            raise BundleRejected(f"staged {row.repo}@{row.commit[:12]} {row.variant} has no build listing here")
        m.staged[i] = (row, out)


@retried
def _listings(ledger: Ledger, rows: list[StagedRow]) -> dict[StagedRow, tuple[FileEntry, ...]]:
    """This home's build listing of each row's variant."""
    with ledger.view() as v:
        return {row: v.variant(row.repo, row.commit, row.variant)[0] for row in rows}
