"""The fleet's demand rolls up the tiers (issue 48): a serve with --upstream hands its demand counts to
its upstream as it writes them, so that central learns what the clusters asked for and did not get.

Why: serve counts what kernels clients ask for by their User-Agent (demand.py). A cluster's clients ask
the cluster; the cluster's pull-through asks its region with its own HubClient (no kernels agent: not
counted there), and a variant the revision does not have is decided at the cluster. So the counts stopped
at the first tier, and `report --demand` at central never showed them.

The wire: after each write of its counts to its own ledger, a serve with --upstream POSTs them to
`{upstream}/api/frt-mirror/demand` (PATH), JSON `{"origin": ..., "rows": [...]}`, at most MAX_ROWS rows
and MAX_BODY bytes a POST, once, with a short timeout. An upstream that is not an frt-mirror (the Hub)
answers 404 or anything else: ignored, never retried, never an error; the Hub sees one small POST per
write interval that has counts, and nothing when there are none. A serve receiving them (any serve: the
endpoint needs no --upstream) checks every field (types, lengths, outcomes, repo ids: at most MAX_BODY
bytes read, MAX_ROWS rows, a target as resolver/targets.py parses it, archs included; else 400/413 and
nothing kept), adds them to its own counts with their origin
in the counts' client column (`tier <origin>`), and, with an upstream of its own, hands them on.

Demand is a hint: it is counted and reported, never staged by itself (`demand manifest` writes a
manifest an operator runs `stage` on). No trust rides on it. A row's origin is what the tier below said,
chained (`cluster > region`), at most ORIGIN_MAX characters; a row received from below keeps its chain.
"""

from __future__ import annotations

import json
import logging
import socket
import urllib.request
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from frt.manifests.fields import repo_id_problem

from .demand_records import OUTCOMES, TIER, Ask, Tally
from .protocol import HubError

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from .demand import DemandRecorder

log = logging.getLogger("frt.serve")
PATH = "/api/frt-mirror/demand"
MAX_BODY = 256 * 1024  # bytes of one POST: MAX_ROWS rows of ~200 bytes
MAX_ROWS = 1000
ORIGIN_MAX = 200
_FIELD_MAX = 256  # asked, target, variant
TIMEOUT = 5.0


def self_origin(port: int | None = None) -> str:
    """This serve as the tier above will name it: its host name (and port)."""
    return f"{socket.gethostname()}:{port}" if port else socket.gethostname()


def _row_origin(ask: Ask, origin: str) -> str:
    """The chain a row goes up with: the one it came with, then this tier."""
    chain = f"{ask.client[len(TIER) :]} > {origin}" if ask.client.startswith(TIER) else origin
    return chain[-ORIGIN_MAX:]


def encode(tallies: Mapping[Ask, Tally], origin: str) -> Iterator[bytes]:
    """The POST bodies for `tallies`, MAX_ROWS rows each."""
    rows = [
        {
            "repo": a.repo,
            "asked": a.asked,
            "target": a.target,
            "outcome": a.outcome,
            "variant": t.variant,
            "count": t.count,
            "first": t.first.astimezone(UTC).isoformat(),
            "last": t.last.astimezone(UTC).isoformat(),
            "origin": _row_origin(a, origin),
        }
        for a, t in tallies.items()
    ]
    for i in range(0, len(rows), MAX_ROWS):
        yield json.dumps({"rows": rows[i : i + MAX_ROWS]}).encode()


class Forwarder:
    """Hands counts to the upstream; what it answers is not this serve's business (see the module's doc)."""

    def __init__(self, upstream: str, origin: str):
        self.url, self.origin = upstream.rstrip("/") + PATH, origin
        self._said = False

    def __call__(self, tallies: Mapping[Ask, Tally]) -> None:
        for body in encode(tallies, self.origin):
            req = urllib.request.Request(self.url, data=body, method="POST")
            req.add_header("Content-Type", "application/json")
            try:
                with urllib.request.urlopen(req, timeout=TIMEOUT) as r:  # noqa: S310  the operator's --upstream
                    r.read(1024)
            except (OSError, ValueError) as e:  # an HTTPError (the Hub's 404) is an OSError too
                if not self._said:  # said once: the upstream may simply not be a mirror
                    self._said = True
                    log.info("demand: the upstream did not take this mirror's counts (%s); not retried", e)
                return


def _text(row: dict[str, Any], key: str, limit: int = _FIELD_MAX) -> str:
    value = row.get(key, "")
    if not isinstance(value, str) or len(value) > limit or any(ord(c) < 32 for c in value):
        raise ValueError(f"{key}: a string of at most {limit} printable characters")
    return value


def _target(row: dict[str, Any]) -> str:
    """A row's target as the tier below counted it: a target in its canonical spelling (archs included,
    as targets.py writes them), or "" (a kernels client naming none this project knows)."""
    text = _text(row, "target")
    if not text:
        return text
    from frt.resolver.errors import FrtError
    from frt.resolver.targets import parse_target

    try:
        ok = not text.startswith("host") and str(parse_target(text)) == text
    except FrtError:
        ok = False
    if not ok:
        raise ValueError(f"target: {text[:80]!r} is not a target (torch<M>.<m>-<backend>-<cpu>-<os>[@ARCH,...])")
    return text


def _time(row: dict[str, Any], key: str) -> datetime:
    value = datetime.fromisoformat(_text(row, key, 40))
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def decode(body: bytes) -> dict[Ask, Tally]:
    """The counts a POST carries, every field checked; ValueError names the first that is not."""
    doc = json.loads(body)
    rows = doc.get("rows") if isinstance(doc, dict) else None
    if not isinstance(rows, list) or len(rows) > MAX_ROWS:
        raise ValueError(f"rows: a list of at most {MAX_ROWS}")
    out: dict[Ask, Tally] = {}
    for row in rows:
        if not isinstance(row, dict):
            raise ValueError("a row is an object")
        repo, outcome, count = _text(row, "repo", 96), _text(row, "outcome", 16), row.get("count")
        if problem := repo_id_problem(repo):
            raise ValueError(f"repo: {problem}")
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome: one of {', '.join(OUTCOMES)}")
        if not isinstance(count, int) or isinstance(count, bool) or not 0 < count <= 1 << 31:
            raise ValueError("count: a positive integer")
        origin = _text(row, "origin", ORIGIN_MAX)
        ask = Ask(repo, _text(row, "asked"), _target(row), outcome, TIER + origin)
        t = out.get(ask)
        first, last = _time(row, "first"), _time(row, "last")
        if t is None:
            out[ask] = Tally(count, first, last, _text(row, "variant"))
        else:
            t.count, t.first, t.last = t.count + count, min(t.first, first), max(t.last, last)
    return out


async def receive_demand(request: Request, demand: DemandRecorder) -> Response:
    """POST PATH: a tier below's counts, added to this serve's (bounded; see the module's doc)."""
    from starlette.responses import Response

    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY:
            raise HubError(413, None, f"demand: a POST of at most {MAX_BODY} bytes")
    try:
        tallies = decode(body)
    except (ValueError, TypeError, AttributeError) as e:  # json's errors are ValueErrors
        raise HubError(400, None, f"demand: {e}"[:300]) from None
    demand.add(tallies)
    return Response(status_code=204)
