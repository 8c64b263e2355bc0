"""The publisher's own integrity record (metadata.json `digest`) applied to a staged variant.

Upstream's LFS sha256 / git oid says the bytes are what the upstream *serves*; the digest says they
are what the *publisher built*. A compromised or broken upstream — or another mirror in the chain —
can serve consistent hashes for the wrong bytes; only the digest catches that, and it can be checked
again offline, on the cluster (`verify`). The rule itself is `kernels`' (frt.resolver.kernel_metadata).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from frt.resolver.kernel_metadata import (
    KernelMetadata,
    MetadataInvalid,
    digest_exempt,
    listing_verdict,
    parse_metadata,
    validate_variant,
)
from frt.resolver.resolution import FileEntry, Refusal, Resolution

from .fetch import expected_key


def variant_metadata(r: Resolution) -> KernelMetadata:
    """The resolution's metadata, parsed by `kernels`; a metadata.json it cannot read is refused."""
    has_file = any(f.path == f"build/{r.variant}/metadata.json" for f in r.files)
    if has_file and not r.metadata:
        raise MetadataInvalid(
            "metadata.json as served is not the file its git oid names, or not a JSON object: "
            "kernels would not load this variant from it"
        )
    return parse_metadata(r.metadata or None)


def metadata_refusal(r: Resolution, e: MetadataInvalid) -> Refusal:
    text = f"{r.repo}@{r.commit[:12]} {r.variant}: {e}"
    return Refusal(r.request, r.target, "MetadataInvalid", text, detail=str(e), commit=r.commit)


def _in_variant(r: Resolution, path: str) -> str:
    return path[len(f"build/{r.variant}/") :]


def publisher_expectations(pairs: Iterable[tuple[Resolution, KernelMetadata]]) -> dict[str, set[str]]:
    """Per blob key, every sha256 some publisher's digest expects of it (a blob shared by several
    variants is stored if any of them vouches for its bytes; each variant is then judged alone)."""
    out: dict[str, set[str]] = {}
    for r, meta in pairs:
        for f in r.files:
            rel = _in_variant(r, f.path)
            if not digest_exempt(rel) and (want := meta.expected_sha256(rel)):
                out.setdefault(expected_key(f), set()).add(want)
    return out


def digest_mismatch(r: Resolution, meta: KernelMetadata, sha256_of: Callable[[FileEntry], str | None]) -> str | None:
    """Why this variant's stored files are not what its publisher's digest lists; None when they are."""
    for f in r.files:
        rel = _in_variant(r, f.path)
        want = None if digest_exempt(rel) else meta.expected_sha256(rel)
        if want and sha256_of(f) != want:
            return (
                f"{r.repo}/{f.path}@{r.commit[:12]}: the publisher's digest (metadata.json) says sha256 "
                f"{want}; the bytes served hash to {sha256_of(f)}"
            )
    return None


def view_check(
    meta: KernelMetadata, pairs: Iterable[tuple[FileEntry, str]], variant: str
) -> Callable[[Path], list[str]]:
    """For Views.link: the variant directory it lays out from `pairs`, judged by kernels' own digest rule.
    From the hashes where the digest is sha256 (Views.link lays out exactly these files: no byte is read
    again); else by re-hashing the laid-out dir."""
    verdict = listing_verdict(meta, pairs, variant)
    return lambda variant_dir: validate_variant(meta, variant_dir) if verdict is None else verdict
