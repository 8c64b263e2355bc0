"""Bearer tokens for `serve`, stored hashed in the ledger. With none, the mirror is open."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable
from typing import Any, cast

from sqlalchemy import CursorResult, delete, select

from frt.resolver.errors import BadInput
from frt.resolver.ledger import Ledger

from ..schema import Token
from ..store.records import bump_serial


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def add_token(ledger: Ledger, name: str) -> str:
    """Create a token; the only time its value is seen is this return."""
    if not name or len(name) > 100 or not name.replace("-", "").replace("_", "").isalnum():
        raise BadInput(f"bad token name {name!r}: letters, digits, '-' and '_'")
    token = "frt_" + secrets.token_urlsafe(32)
    with ledger.session() as s:
        if s.scalar(select(Token.id).where(Token.name == name)) is not None:
            raise BadInput(f"a token named {name!r} exists; revoke it first")
        s.add(Token(name=name, sha256=_hash(token)))
        bump_serial(s)  # serve's replicas reload what they answer, tokens included
    return token


def list_tokens(ledger: Ledger) -> list[tuple[str, str]]:
    with ledger.session(write=False) as s:
        return [(t.name, t.created_at.isoformat()) for t in s.scalars(select(Token).order_by(Token.name))]


def revoke_token(ledger: Ledger, name: str) -> None:
    with ledger.session() as s:
        # a DELETE's result is a CursorResult (it has rowcount); Session.execute is typed as plain Result
        result = cast("CursorResult[Any]", s.execute(delete(Token).where(Token.name == name)))
        if result.rowcount == 0:
            raise BadInput(f"no token named {name!r}")
        bump_serial(s)


def token_hashes(ledger: Ledger) -> frozenset[str]:
    with ledger.session(write=False) as s:
        return frozenset(s.scalars(select(Token.sha256)))


class TokenCheck:
    """Per-request check against the token hashes serve holds in memory (`hashes()`: the catalog's, which
    follows the ledger's change serial): a request never waits on the ledger, and a ledger that is down
    leaves the last tokens it gave in force. A revocation bumps the serial, so it takes effect as soon
    as each replica's poll sees it (FRT_SERVE_POLL, 1 s)."""

    def __init__(self, hashes: Callable[[], frozenset[str]]):
        self.hashes = hashes

    def __call__(self, header: str | None) -> bool:
        hashes = self.hashes()
        if not hashes:
            return True
        if not header or not header.lower().startswith("bearer "):
            return False
        digest = _hash(header[7:].strip())
        return any(hmac.compare_digest(digest, h) for h in hashes)
