"""The blob store on an S3-compatible object store (`--store s3://BUCKET/PREFIX`, $FRT_STORE_URL).

The same promises as the filesystem store (blobs.py), by what S3 gives: a blob's key is its sha256
(`PREFIX/sha256/<sha[:2]>/<sha>`, the filesystem store's layout); its bytes are downloaded and verified on
this host first (into the home's local tmp/, as for the filesystem store), then uploaded, which S3 makes
visible only whole. Every PUT carries the sha256 of what it sends (x-amz-checksum-sha256: the server refuses
bytes that arrive otherwise). A blob up to SINGLE_PUT_MAX goes in one PUT, conditional (If-None-Match: *):
a key once written is never replaced, so two stagers racing on one blob store it once, and the second finds
it there. A bigger one goes in parts, PARTS_AT_ONCE in flight, read from the part file as they go (obstore
holds a single PUT's body in memory whole: a 4 GiB model shard was 4 GiB of RSS per upload); parts cannot
be conditional, so the key is looked for first (HEAD), under the blob's lock that every stager takes: the
race left is with a writer that takes no lock, and what it could replace is the same verified bytes (a new
ETag, which serve judges afresh: serve/objects.py). Locks and parts stay local per host (scratch.py); the
lock across hosts is the ledger server's (Scratch.shared_lock), as on a shared filesystem.

The client is obstore (Rust's object_store; pyproject's s3 extra says why). Endpoint, region and
credentials are read the way AWS's tools read them: AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID, ….
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import threading
import uuid
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, cast

from frt.resolver.errors import BadInput, StoreUnavailable, first_line

from .blobs import Digest, blob_relpath
from .record_size import RECORD_MAX, RecordTooBig
from .scratch import Scratch, SharedLock

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

RETRY_S = 20  # a store that keeps failing this long is unavailable (exit 3), not waited on for obstore's 3 min
SINGLE_PUT_MAX = 8 << 20  # one conditional PUT up to this (obstore holds its body in memory); bigger: parts
PART_SIZE = 8 << 20  # a multipart upload's part (S3: at least 5 MiB, at most 10,000 of them: 78 GiB)
PARTS_AT_ONCE = 2  # parts of one blob in flight: PART_SIZE x this of memory per upload
UPLOADS_AT_ONCE = 8  # commit_synced's (an import's) blobs in flight


def _client(url: str) -> Any:
    try:
        from obstore.store import S3Store
    except ImportError:
        raise BadInput(f"{url}: the S3 store needs obstore: pip install 'frt-mirror[s3]'") from None
    bucket, _, prefix = url[len("s3://") :].partition("/")
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
    # Each PUT sends the sha256 of what it sends: a byte changed on the way is refused by the server.
    return S3Store(
        bucket,
        prefix=prefix or None,
        checksum_algorithm="sha256",
        client_options={"allow_http": endpoint.startswith("http://")},
        retry_config={
            "max_retries": 3,
            "retry_timeout": timedelta(seconds=RETRY_S),
            "backoff": {"init_backoff": timedelta(seconds=0.1)},
        },
    )


class S3BlobStore:
    """A BlobStore (protocol.py) whose blobs are objects: its `objects`, for what serve and nginx fetch
    by presigned URLs (the client, each blob's key)."""

    def __init__(self, url: str, home: Path, shared_lock: SharedLock | None = None):
        self.url = url
        self.scratch = Scratch(home, shared_lock)  # tmp/ and locks/ stay local per host
        self.client = _client(url)
        self._seen: set[str] = set()  # keys known to exist: an object, once written, never changes
        self.uploaded = 0  # blobs this process put (the rest were there already)
        self._counting = threading.Lock()  # uploads run in several threads (stage's, commit_synced's)

    @property
    def where(self) -> str:
        return self.url

    @property
    def files(self) -> None:
        return None

    @property
    def objects(self) -> S3BlobStore:
        return self

    def key(self, sha256: str) -> str:
        return f"sha256/{blob_relpath(sha256)}"

    def locator(self, sha256: str) -> Path:
        return Path(self.key(sha256))  # relative: a key in the bucket, never opened as a file (serve/objects.py)

    def stored_of(self, shas: Iterable[str]) -> set[str]:
        return set(shas) & set(self.blob_shas())

    def has(self, sha256: str) -> bool:
        if sha256 in self._seen:
            return True
        import obstore

        try:
            obstore.head(self.client, self.key(sha256))
        except FileNotFoundError:
            return False
        except Exception as e:  # noqa: BLE001  (obstore's errors: a dead or refusing endpoint)
            raise self._unavailable("HEAD", sha256, e) from None
        self._seen.add(sha256)
        return True

    def forget(self, sha256: str) -> None:
        """`sha256`'s object was removed by another hand (serve's quarantine): `has` asks the store again."""
        self._seen.discard(sha256)

    def size(self, sha256: str) -> int | None:
        import obstore

        try:
            return int(obstore.head(self.client, self.key(sha256))["size"])
        except FileNotFoundError:
            return None
        except Exception as e:  # noqa: BLE001
            raise self._unavailable("HEAD", sha256, e) from None

    def commit(self, part: Path, digest: Digest) -> None:
        """Upload a verified `.part` under its sha256 (once: a key already there is another stager's same
        bytes), then drop the part: there is no local file."""
        self._upload(part, digest)
        part.unlink(missing_ok=True)

    def commit_synced(self, parts: list[tuple[Path, Digest]]) -> None:
        """commit() of each, UPLOADS_AT_ONCE at a time (an upload waits on the store, not on this host)."""
        with ThreadPoolExecutor(max_workers=UPLOADS_AT_ONCE, thread_name_prefix="frt-upload") as pool:
            for done in [pool.submit(self.commit, part, digest) for part, digest in parts]:
                done.result()

    def _upload(self, part: Path, digest: Digest) -> None:
        import obstore
        from obstore.exceptions import AlreadyExistsError

        key = self.key(digest.sha256)
        try:
            if digest.size <= SINGLE_PUT_MAX:
                obstore.put(self.client, key, part, mode="create", use_multipart=False)
                self._count()
            elif not self.has(digest.sha256):  # parts cannot be conditional: looked for first (module doc)
                obstore.put(
                    self.client, key, part, use_multipart=True, chunk_size=PART_SIZE, max_concurrency=PARTS_AT_ONCE
                )
                self._count()
        except AlreadyExistsError:
            pass
        except StoreUnavailable:
            raise
        except Exception as e:  # noqa: BLE001
            raise self._unavailable("PUT", digest.sha256, e) from None
        self._seen.add(digest.sha256)

    def _count(self) -> None:
        with self._counting:
            self.uploaded += 1

    def digest(self, sha256: str) -> Digest:
        """Both hashes of the object as stored, streamed (never held whole)."""
        size = self.size(sha256)
        if size is None:
            raise FileNotFoundError(f"{self.url}/{self.key(sha256)}")
        h256, hgit = hashlib.sha256(), hashlib.sha1(f"blob {size}\0".encode())
        n = 0
        for chunk in self.stream(sha256):
            h256.update(chunk)
            hgit.update(chunk)
            n += len(chunk)
        return Digest(h256.hexdigest(), hgit.hexdigest(), n)

    def open(self, sha256: str) -> BinaryIO:
        return cast(BinaryIO, _Reader(self.stream(sha256)))

    def stream(self, sha256: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        """The object's bytes [start, end), in chunks as they arrive."""
        import obstore

        options: Any = None
        if start or end is not None:
            options = {"range": (start, end) if end is not None else {"offset": start}}
        try:
            got = obstore.get(self.client, self.key(sha256), options=options)
            for chunk in got.stream(min_chunk_size=1 << 20):
                yield bytes(chunk)
        except FileNotFoundError:
            raise
        except Exception as e:  # noqa: BLE001
            raise self._unavailable("GET", sha256, e) from None

    @contextmanager
    def as_file(self, sha256: str) -> Iterator[Path]:
        """The object fetched into tmp/ (under the name of a part of its sha256: gc removes it only under
        that blob's lock, once old), and removed after."""
        part = self.scratch.part_path(f"{sha256}.read-{uuid.uuid4().hex}")
        try:
            with open(part, "wb") as out:
                for chunk in self.stream(sha256):
                    out.write(chunk)
            yield part
        finally:
            part.unlink(missing_ok=True)

    def remove(self, sha256: str, *keys: str) -> None:
        import obstore

        with self.scratch.lock(sha256, *keys):
            try:
                obstore.delete(self.client, self.key(sha256))
            except FileNotFoundError:
                pass
            except Exception as e:  # noqa: BLE001
                raise self._unavailable("DELETE", sha256, e) from None
        self._seen.discard(sha256)

    def blob_shas(self) -> list[str]:
        """Every blob's sha256 in the store (a listing under PREFIX/sha256/)."""
        return sorted(sha for sha, _, _ in self.blob_stats())

    def blob_stats(self) -> Iterator[tuple[str, int, tuple[int, int] | None]]:
        import obstore

        try:
            listed = obstore.list(self.client, "sha256").collect()
        except Exception as e:  # noqa: BLE001
            raise self._unavailable("LIST", "", e) from None
        for o in listed:
            yield str(o["path"]).rsplit("/", 1)[-1], int(o["size"]), None

    # The ledger's records (row_records.py), under PREFIX/records/: one unconditional PUT each, which S3
    # makes visible whole; a later PUT of the same name replaces it.
    def put_record(self, name: str, data: bytes) -> None:
        self._records_op("PUT", name, lambda obstore: obstore.put(self.client, f"records/{name}", data))

    def read_record(self, name: str) -> bytes:
        def get(obstore: Any) -> bytes:
            got = obstore.get(self.client, f"records/{name}")
            if (size := int(got.meta["size"])) > RECORD_MAX:  # the body is read only below
                raise RecordTooBig(name, size)
            return bytes(got.bytes())

        return cast(bytes, self._records_op("GET", name, get))

    def drop_record(self, name: str) -> None:
        self._records_op("DELETE", name, lambda obstore: obstore.delete(self.client, f"records/{name}"))

    def record_names(self) -> list[str]:
        listed = self._records_op("LIST", "", lambda obstore: obstore.list(self.client, "records").collect())
        return sorted(n for o in listed if (n := str(o["path"]).rsplit("/", 1)[-1]).endswith(".json"))

    def has_records(self) -> bool:
        first = self._records_op(
            "LIST", "", lambda obstore: next(iter(obstore.list(self.client, "records", chunk_size=1)), None)
        )
        return bool(first)

    def _records_op(self, op: str, name: str, call: Any) -> Any:
        import obstore

        try:
            return call(obstore)
        except (FileNotFoundError, RecordTooBig):
            raise
        except Exception as e:  # noqa: BLE001  (obstore's errors: a dead or refusing endpoint)
            raise StoreUnavailable(f"{self.url}: {op} records/{name} failed: {store_said(e)}") from None

    def _unavailable(self, op: str, sha256: str, e: Exception) -> StoreUnavailable:
        what = f" {self.key(sha256)}" if sha256 else ""
        return StoreUnavailable(f"{self.url}: {op}{what} failed: {store_said(e)}")

    def check(self) -> None:
        """Raise StoreUnavailable unless the store answers a listing under PREFIX with these credentials."""
        import obstore

        try:
            next(iter(obstore.list(self.client, "sha256", chunk_size=1)), None)
        except Exception as e:  # noqa: BLE001
            raise self._unavailable("LIST", "", e) from None


_CODE, _MESSAGE = re.compile(r"<Code>([^<]{1,80})</Code>"), re.compile(r"<Message>([^<]{1,200})</Message>")


def store_said(e: Exception) -> str:
    """The store's own reason in one line: obstore's first line ends where the S3 error's XML body begins,
    which holds it (<Code>SignatureDoesNotMatch</Code>, NoSuchBucket, …); a client with no credentials at
    all asks the cloud's metadata endpoint for some, and says that instead."""
    text, line = str(e), first_line(e)
    if (code := _CODE.search(text)) is not None:
        message = _MESSAGE.search(text)
        return f"{line.split('<?xml')[0].rstrip(': ')}: {code[1]}" + (f" ({message[1]})" if message else "")
    if "169.254.169.254" in text and not os.environ.get("AWS_ACCESS_KEY_ID"):
        return (
            "no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (the store's endpoint in AWS_ENDPOINT_URL)"
        )
    return line


class _Reader(io.RawIOBase):
    """An object's chunks as a file to read() from (what tarfile.addfile reads a member's bytes with)."""

    def __init__(self, chunks: Iterator[bytes]):
        self._chunks, self._buf, self._at = chunks, memoryview(b""), 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: WriteableBuffer) -> int:
        # What io hands in (a bytearray or a memoryview), as the one type that slices; released on the way
        # out, since RawIOBase.read resizes its bytearray after this returns.
        with memoryview(b) as out:
            while self._at >= len(self._buf):
                chunk = next(self._chunks, b"")
                if not chunk:
                    return 0
                self._buf, self._at = memoryview(chunk), 0
            n = min(len(out), len(self._buf) - self._at)
            out[:n] = self._buf[self._at : self._at + n]
        self._at += n
        return n
