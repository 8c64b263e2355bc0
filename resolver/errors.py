"""One error family for frt-mirror, and the one place that maps it to exit codes.

A refusal is an outcome, not a crash: `Refused` (resolution.KernelUnavailable, which carries the
`Refusal` that explains it, so the CLI, the ledger and the message all render one object). This module
imports nothing of ours: every module may raise its errors.
Everything else a user can cause (bad target, malformed repo id, dead upstream,
corrupt ledger) is a `FrtError` with one clear line of text.
"""

from __future__ import annotations

import errno


class FrtError(Exception):
    """Base of every error frt-mirror raises on purpose; its str() is one line for users."""


def first_line(e: BaseException | None) -> str:
    """One line for users from any error: its first line (a database error's driver message, not
    SQLAlchemy's wrapper), plus the server's own message when huggingface_hub kept it on a later line
    (after a generic "404 Client Error.")."""
    orig = getattr(e, "orig", None) or e
    text = str(orig).strip().splitlines()
    line = text[0] if text else type(orig).__name__
    server = (getattr(e, "server_message", None) or "").strip().replace("\n", " ")
    return f"{line} {server}" if server and server not in line else line


def one_line(text: str) -> str:
    """The text as one printable line: a character that would break the line or hide what follows
    (controls, line and paragraph separators, bidi and other format characters, which an upstream's or a
    user's value may carry into a message) is written as its escape, the rest kept as it is."""
    return "".join(c if c.isprintable() or c == " " else c.encode("unicode_escape").decode() for c in text)


class BadInput(FrtError, ValueError):
    """The user gave something we cannot use: target syntax, repo id, manifest, option."""


class BadTargetField(BadInput):
    """A target's field (`torch`, `backend`, `cpu`, `os`, `archs`) is not one a build can name: `field` says
    which, so that a manifest's error points at that field's line."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


class UpstreamUnavailable(FrtError):
    """The upstream Hub (or mirror) could not be reached or kept failing after retries."""


class UpstreamMalformed(UpstreamUnavailable):
    """The upstream answered, but not as the Hub does (not JSON, the wrong shape, past a size, page or
    redirect limit, a redirect off http): one line naming the route and what was wrong. Not retried; exit 3,
    as for an unreachable upstream, since the same command may work against a healthy one."""


class LedgerCorrupt(FrtError):
    """The SQLite ledger under the home cannot be opened or read."""


class HomeReadOnly(FrtError):
    """The home (or its ledger) is read-only here, a cluster's shared mount, and this needs to write it."""


class Refused(FrtError):
    """What was asked has no answer that holds, and the reason is data, not a crash (exit 3)."""


class VerificationFailed(FrtError):
    """Bytes did not match what was advertised or recorded (a tampered download or bundle)."""


class LocalDiskError(FrtError):
    """A write to the local disk failed (full, read-only): the home's problem, not the upstream's."""

    @classmethod
    def writing(cls, where: object, e: OSError) -> LocalDiskError:
        """The one line for a failed write of `where` (a path, or what was being written)."""
        return cls(f"cannot write {where}: {e.strerror or e} (a local disk error)")


class NotEnoughSpace(LocalDiskError):
    """A write that knows its size beforehand (stage) would not fit the disk's free space less a margin:
    refused before its first byte, so the disk is never filled on the way to the same failure."""


class LedgerUnavailable(FrtError):
    """The ledger's database could not be had in time (locked past the busy timeout, or down)."""


class LedgerDropped(LedgerUnavailable):
    """The ledger's server dropped or refused the connection (a restart): a writer retries the unit
    (resolver/ledger/retry.py); anyone else says "try again later", as for any LedgerUnavailable."""


class StoreUnavailable(FrtError):
    """The blob store on an object store (--store s3://…) could not be reached or kept failing: the same
    command may work later, as for an unreachable upstream."""


# Exit codes of the contract: 0 ok, 1 refused or failed verification, 2 bad usage or input (a local file
# the user named or the home holds, unwritable or missing, too), 3 the upstream, the ledger's database or
# the object store unavailable: the same command may work later; 4 the local disk (full, or short of what
# a stage needs): neither the input's fault nor fixed by waiting, but by freeing or growing the disk;
# 130 interrupted (Ctrl-C) and 141 the reader of stdout gone (`| head`), silently: as shells have them.
EXIT_OK, EXIT_REFUSED, EXIT_BAD_INPUT, EXIT_UNAVAILABLE, EXIT_DISK, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130
EXIT_PIPE = 141

# A write failing with one of these is the disk's state, not the path's: full, or over a quota or size cap.
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def exit_code(exc: BaseException) -> int:
    """The CLI's exit code for an error: the one map. Unknown errors are bugs, not refusals: re-raised.
    Bad input first: a refusal that is also the user's mistake (resolution.UnknownRepo) is a 2."""
    if isinstance(exc, BadInput):
        return EXIT_BAD_INPUT
    if isinstance(exc, BrokenPipeError):
        return EXIT_PIPE
    if isinstance(exc, (Refused, VerificationFailed)):
        return EXIT_REFUSED
    if isinstance(exc, (UpstreamUnavailable, LedgerUnavailable, StoreUnavailable)):
        return EXIT_UNAVAILABLE
    if isinstance(exc, LocalDiskError) or (isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS):
        return EXIT_DISK
    if isinstance(exc, (FrtError, OSError)):
        return EXIT_BAD_INPUT
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    raise exc


def error_line(exc: BaseException) -> str:
    """The one line the CLI says for an error `exit_code` maps."""
    if isinstance(exc, FrtError):
        return str(exc)
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    filename = getattr(exc, "filename", None)
    where = f"{filename}: " if filename else ""
    return f"{where}{getattr(exc, 'strerror', None) or exc}"
