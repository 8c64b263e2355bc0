"""serve's --cache-max and --min-free, which bound what pull-through keeps (frt.mirror.serve.cache_cap)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

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
