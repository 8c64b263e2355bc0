"""Ed25519 keys and signatures for bundles (`frt-mirror key new`, `bundle --sign`, `import
--require-signature`).

What is signed is a bundle's manifest, which names every blob member by its sha256 and size: a blob
that does not hash to its listed digest is refused on import anyway, so signing the manifest binds
every byte of the archive. The signed bytes are prefixed with a context string, so a signature made
for a bundle cannot be replayed as a signature over some other document signed by the same key.

Keys are files: PATH holds the private key (PKCS#8 PEM, unencrypted, mode 0600: the connected box
keeps it), PATH.pub the public key (SubjectPublicKeyInfo PEM, which `openssl pkey -pubin` reads: the
cluster keeps it). A key's id is the first 16 hex digits of the sha256 of its raw public bytes.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from frt.resolver.errors import BadInput
from frt.resolver.fs import atomic_write

ALGORITHM = "ed25519"
_CONTEXT = b"frt-mirror bundle manifest v1\n"


@dataclass(frozen=True)
class KeyPair:
    private: Path
    public: Path
    key_id: str


def key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def new_key(path: Path) -> KeyPair:
    """Write a fresh key pair at PATH and PATH.pub; refuse if either exists (never overwrite a key:
    the bundles signed with it, and the clusters trusting its .pub, would be orphaned)."""
    pub_path = path.with_name(path.name + ".pub")
    for p in (path, pub_path):
        if p.exists() or p.is_symlink():
            raise BadInput(f"{p} exists: a key is never overwritten (choose another PATH)")
    if not path.parent.is_dir():
        raise BadInput(f"{path.parent} is not a directory")
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    _write_new(path, private, 0o600)
    try:
        _write_new(pub_path, public, 0o644)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return KeyPair(path, pub_path, key_id(key.public_key()))


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """Never over an existing key, and never seen half-written or, for the private one, readable by others."""
    try:
        atomic_write(path, data, mode=mode, exclusive=True)
    except FileExistsError:
        raise BadInput(f"{path} exists: a key is never overwritten (choose another PATH)") from None


def load_private(path: Path) -> Ed25519PrivateKey:
    data = _read(path)
    if b"PUBLIC KEY" in data:
        raise BadInput(f"{path} is a public key: --sign takes the private key ({path.name.removesuffix('.pub')})")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as e:
        raise BadInput(f"{path} is not an unencrypted PEM private key ({e})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise BadInput(f"{path} is not an ed25519 key: make one with 'frt-mirror key new PATH'")
    return key


def load_public(path: Path) -> Ed25519PublicKey:
    data = _read(path)
    if b"PRIVATE KEY" in data:
        raise BadInput(f"{path} is a private key: --require-signature takes the public one ({path.name}.pub)")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as e:
        raise BadInput(f"{path} is not a PEM public key ({e})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise BadInput(f"{path} is not an ed25519 public key: make one with 'frt-mirror key new PATH'")
    return key


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise BadInput(f"{path}: {e.strerror or e}") from None


def sign(manifest: bytes, key: Ed25519PrivateKey) -> bytes:
    """The signature member's bytes: which key signed which manifest (by sha256), and the signature."""
    doc = {
        "algorithm": ALGORITHM,
        "key_id": key_id(key.public_key()),
        "manifest_sha256": hashlib.sha256(manifest).hexdigest(),
        "signature": base64.b64encode(key.sign(_CONTEXT + manifest)).decode(),
    }
    return json.dumps(doc, indent=1, sort_keys=True).encode()


def check(manifest: bytes, signature: bytes, key: Ed25519PublicKey) -> str | None:
    """None when `signature` (a signature member) is `key`'s over `manifest`; else why not, in words."""
    try:
        doc = json.loads(signature)
        algorithm, signer, sig = doc["algorithm"], doc["key_id"], base64.b64decode(doc["signature"], validate=True)
    except (ValueError, KeyError, TypeError) as e:
        return f"the signature member is malformed ({type(e).__name__})"
    if algorithm != ALGORITHM:
        return f"signed with {algorithm!r}, not {ALGORITHM}"
    want = key_id(key)
    if signer != want:
        return f"signed by key {signer}, not by the required key {want}"
    got = hashlib.sha256(manifest).hexdigest()
    if doc.get("manifest_sha256") != got:
        return (
            f"the signature is over a manifest with sha256 {str(doc.get('manifest_sha256'))[:16]}…, this one "
            f"hashes to {got[:16]}…: the bundle was altered after signing"
        )
    try:
        key.verify(sig, _CONTEXT + manifest)
    except InvalidSignature:
        return f"the signature by key {want} does not match the manifest: the bundle was altered after signing"
    return None
