"""A small fake Hugging Face Hub for tests: an in-memory repo model and a stdlib HTTP server."""

from .faults import Faults
from .repo import Commit, FakeRepo, FileMeta, git_blob_oid, sha256
from .server import FakeHub

__all__ = ["Commit", "FakeHub", "FakeRepo", "Faults", "FileMeta", "git_blob_oid", "sha256"]
