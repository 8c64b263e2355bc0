"""A small fake Hugging Face Hub for tests: an in-memory repo model and a stdlib HTTP server
(plus, with `redirects=True`, a CDN host; with `rate_limits=`, the Hub's 429s)."""

from .faults import Faults
from .ratelimit import RateLimits
from .repo import Commit, FakeRepo, FileMeta, git_blob_oid, sha256
from .server import FakeHub
from .wire import LoggedRequest

__all__ = [
    "Commit",
    "FakeHub",
    "FakeRepo",
    "Faults",
    "FileMeta",
    "LoggedRequest",
    "RateLimits",
    "git_blob_oid",
    "sha256",
]
