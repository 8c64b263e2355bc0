"""A checked manifest's wheels, repos and publishers into the ledger: what `import` and `ledger rebuild`
both merge, each inside its own transaction."""

from __future__ import annotations

from frt.resolver.ledger import Ledger
from frt.resolver.ledger.io import merge_repo_record

from ..store.records import record_wheels
from .check import Manifest


def merge_manifest(ledger: Ledger, m: Manifest) -> None:
    """Merged, not replaced: merge_repo_record keeps the newest upstream answer a repo has had."""
    record_wheels(ledger, m.wheels)
    for repo in m.repos:
        merge_repo_record(
            ledger,
            repo.repo,
            repo_type=repo.repo_type,
            endpoint=repo.endpoint,
            scanned_at=repo.scanned_at,
            refs=repo.refs,
            commits=repo.commits,
            listings=repo.listings,
            builds=repo.builds,
        )
    for pub in m.publishers:
        ledger.record_publisher(pub.org, pub.trusted, endpoint=pub.endpoint, seen_at=pub.seen_at)
