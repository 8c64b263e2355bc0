"""serve's --cache-max and --min-free, which bound what pull-through keeps (frt.mirror.serve.cache_cap)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from frt.mirror.serve.cache_cap import CacheBounds, parse_size
from frt.resolver.errors import BadInput

if TYPE_CHECKING:
    from frt.mirror.serve.pull import Upstream

F = TypeVar("F", bound=Callable[..., Any])


def cache_options(f: F) -> F:
    f = click.option(
        "--min-free",
        "min_free",
        metavar="SIZE",
        help="With --upstream: evict pulled blobs (least recently used first) to keep SIZE free on the store's "
        "disk (at least stage's margin, FRT_DISK_MARGIN_MIB: the free space is read as stage reads it).",
    )(f)
    return click.option(
        "--cache-max",
        "cache_max",
        metavar="SIZE",
        help="With --upstream: keep the blobs pulled through within SIZE (10GiB, 500M, bytes): before a file "
        "is fetched, the least recently used pulled blobs are evicted to make room for it. Staged blobs are "
        "never evicted, nor one being sent; each eviction is recorded (the pulled variant unstaged). A file "
        "larger than SIZE, or one there is no room for while the rest is being read, is passed through "
        "unkept (verified as ever).",
    )(f)


def capped(pull: Upstream | None, cache_max: str | None, min_free: str | None, s3: str | None) -> Upstream:
    """serve's --upstream with --cache-max / --min-free (at least one given); `s3`: the --store URL of an
    object store, which is refused."""
    named = "--cache-max" if cache_max is not None else "--min-free"
    if pull is None:
        raise BadInput(f"{named} only means something with --upstream URL (it bounds what pull-through keeps)")
    if s3 is not None:
        raise BadInput(
            f"--store {s3}: {named} needs the blobs as files on this host; bound the bucket with the object "
            "store's own lifecycle rules"
        )
    bounds = CacheBounds(
        parse_size(cache_max, "--cache-max") if cache_max is not None else None,
        parse_size(min_free, "--min-free") if min_free is not None else None,
    )
    return dataclasses.replace(pull, cache=bounds)
