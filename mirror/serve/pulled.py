"""How a file that pull-through lists but does not store is answered (MirrorApp.resolve, on a GET):

- passed through unkept (passthrough.py), where the disk cannot take it or its repo is held in memory
  only (the ledger could not record it: unrecorded.py);
- streamed while it is fetched into the store (stream.py), a big LFS file (pull.STREAM_MIN);
- else fetched, verified and stored first, then answered from the store as any stored file (the
  ServedFile returned); a fetch that meets a full disk (its `.part` removed at once), or a cache cap
  that cannot take it (cache_cap.NoRoom), passes through.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from frt.resolver.errors import FrtError, LocalDiskError

from .blob import file_headers
from .cache_cap import NoRoom
from .catalog import ServedFile, ServedRepo, etag_of
from .objects import ObjectIntegrity
from .passthrough import Passage, PassThroughResponse
from .pin import hold
from .pull import PullService
from .stream import FlowResponse
from .unavailable import upstream_error

if TYPE_CHECKING:
    from starlette.types import Scope

    from .blob import FileIntegrity


async def pulled(
    service: PullService,
    repo: ServedRepo,
    commit: str,
    f: ServedFile,
    integrity: FileIntegrity | ObjectIntegrity,
    scope: Scope,
) -> ServedFile | PassThroughResponse | FlowResponse:
    """The answer for `f` (not stored) at `commit`: a response, or `f` as now stored (held against
    eviction in `scope` until the request's answer opens it: pin.py)."""
    passage = Passage(repo.repo_type, repo.repo_id, commit, f)
    headers = [
        *file_headers(commit, etag_of(f), f.sha256 if f.lfs else None, f.size),
        (b"content-length", b"%d" % f.size),
    ]
    if service.passes(repo, f):
        return PassThroughResponse(service, passage, headers)
    if service.streams(f):  # sent as it comes, whole (a Range too)
        objects = integrity if isinstance(integrity, ObjectIntegrity) else None
        return FlowResponse(service.begin(repo, commit, f), service, headers, objects, passage)
    try:
        stored, pin = await service.file(repo, commit, f)
    except (LocalDiskError, NoRoom):  # the disk (said by disk.py) or the cache cannot take it: nothing kept
        return PassThroughResponse(service, passage, headers)
    except FrtError as e:
        raise upstream_error(e, passage.where, service.come_back()) from None
    hold(scope, pin)  # until this request's answer has opened the blob itself (pin.py)
    return stored
