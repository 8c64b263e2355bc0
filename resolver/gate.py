"""The one gate where data enters: paths, commit ids, ref names, repo ids and variant names.

Whatever upstream lists, a bundle carries, a ledger holds or a user types becomes, sooner or later,
a file name under the home or an export dir (`views/…/<commit>/build/<variant>/<path>`,
`refs/<name>`, `snapshots/<commit>/<path>`). Every one of them passes a `check_*` here where it
enters, so the code that joins them into paths never has to ask again. Each check returns the value
unchanged or raises a `BadInput` subclass whose one line names the value and `where` it came from,
e.g. "upstream listing of org/name@abc123: path 'build/v/../../x' climbs out of the repo".

The upstream's JSON answers pass here too, each route's against its shape (`SHAPES`: per field, a
rule and the reason it is broken) before anything reads a field; a malformed answer is one
`UpstreamMalformed` line (exit 3) naming the route, the item and the field.

Depends on nothing but `errors` and the repo id rule, which frt.manifests states (it imports nothing
of ours, so it cannot call this module; the gate calls it), so anything may call it.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, cast
from urllib.parse import urlsplit

from frt.manifests.fields import org_problem, repo_id_problem

from .errors import BadInput, UpstreamMalformed

# NAME_MAX of the filesystems a home lives on; a longer component cannot be written at all, and
# refusing it here gives one line instead of an OSError half-way through a stage.
MAX_COMPONENT = 255
# Well under PATH_MAX (4096) once joined under a home, views/local/<org>--<name>/<commit>/.
MAX_PATH = 1024

_HEX40, _HEX64 = re.compile(r"[0-9a-f]{40}"), re.compile(r"[0-9a-f]{64}")
# kernel-builder's variant names (torch-universal, torch29-cxx11-cu128-x86_64-linux): one directory.
_VARIANT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")
# git check-ref-format: these never appear in a ref name (besides controls and space).
_REF_BAD_CHARS = set("~^:?*[\\ ")


class UnsafePath(BadInput):
    """A file path that is not a plain relative path inside its repo."""


class BadCommitId(BadInput):
    """A commit id (or blob hash) that is not the full lowercase hex git and the Hub use."""


class BadRefName(BadInput):
    """A branch, tag or revision name git itself would refuse."""


class BadRepoId(BadInput):
    """Not a Hub repo id `org/name`."""


class BadVariantName(BadInput):
    """A build variant name that is not one plain directory name."""


def _say(where: str | None, text: str) -> str:
    return f"{where}: {text}" if where else text


def _controls(value: str) -> bool:
    """NUL and other C0/C1 controls and DEL: never in a name we write, and they garble the one line.
    Format characters too (Unicode Cf: the bidi overrides U+202E, U+2066-2069, zero-width ones): a file
    named `x<U+202E>os.py` shows as `xyp.so`, so a listing or a log line would lie about what it names.
    isprintable() is False for every Cc and Cf, so the common name costs one C-level scan."""
    if value.isprintable():
        return False
    return any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 or unicodedata.category(c) == "Cf" for c in value)


def _utf8_len(value: str) -> int | None:
    """Length in bytes as the filesystem sees it; None for a lone surrogate, which no file can be named."""
    try:
        return len(value.encode())
    except UnicodeEncodeError:
        return None


def path_problem(path: object) -> str | None:
    """Why `path` is not a plain relative path inside a repo; None when it is one."""
    if not isinstance(path, str) or not path:
        return "is empty" if path == "" else "is not a string"
    size = _utf8_len(path)
    if size is None:
        return "is not valid text"
    if _controls(path):
        return "holds a control character (or a bidi/format one)"
    if "\\" in path:
        return "holds a backslash"
    if path.startswith("/"):
        return "is absolute"
    parts = path.split("/")
    if ".." in parts:
        return "climbs out of the repo"
    if any(p in ("", ".") for p in parts):
        return "has an empty or '.' segment"
    if size > MAX_PATH or any(len(p.encode()) > MAX_COMPONENT for p in parts):
        return f"is too long (a name over {MAX_COMPONENT} bytes or the path over {MAX_PATH})"
    return None


def check_path(path: object, *, where: str, under: str = "") -> str:
    """A repo file path to join under a root: relative, no `..`, `.` or empty segment, no backslash
    or control character, not overlong; with `under` ("build/<variant>/"), it must lie below that."""
    problem = path_problem(path)
    if problem is None and under and not cast(str, path).startswith(under):  # no problem: a str
        problem = f"lies outside {under}"
    if problem:
        raise UnsafePath(_say(where, f"path {path!r} {problem}"))
    return cast(str, path)  # path_problem found none: a str


def check_commit(sha: object, *, where: str, what: str = "commit id") -> str:
    """Exactly 40 lowercase hex: git's full sha1, as the Hub names commits (no short or upper case)."""
    if not (isinstance(sha, str) and _HEX40.fullmatch(sha)):
        raise BadCommitId(_say(where, f"{what} {sha!r} is not a commit id (40 lowercase hex)"))
    return sha


def check_git_oid(oid: object, *, where: str) -> str:
    """A file's git blob oid: 40 lowercase hex, as a commit id."""
    return check_commit(oid, where=where, what="git oid")


def check_sha256(digest: object, *, where: str) -> str:
    """A sha256 content hash, 64 lowercase hex: it names a blob file in the store and the Hub cache."""
    if not (isinstance(digest, str) and _HEX64.fullmatch(digest)):
        raise BadCommitId(_say(where, f"sha256 {digest!r} is not a sha256 (64 lowercase hex)"))
    return digest


# git check-ref-format's structural rules, in its order of mention; the reason names the one broken.
_REF_RULES = (
    (lambda n: ".." in n, "holds '..'"),
    (lambda n: n.startswith("/"), "starts with '/'"),
    (lambda n: n.startswith("-"), "starts with '-'"),  # would read as an option to git and tools
    (lambda n: n.endswith("/"), "ends with '/'"),
    (lambda n: "//" in n, "holds '//'"),
    (lambda n: n.endswith("."), "ends with '.'"),
    (lambda n: "@{" in n or n == "@", "holds '@{' or is '@'"),
    (lambda n: any(p.startswith(".") for p in n.split("/")), "has a part starting with '.'"),
    (lambda n: any(p.endswith(".lock") for p in n.split("/")), "has a part ending in '.lock'"),
)


def ref_problem(name: object) -> str | None:
    """Why `name` is not a ref name git would take (check-ref-format, in spirit); None when it is."""
    if not isinstance(name, str) or not name:
        return "is empty" if name == "" else "is not a string"
    size = _utf8_len(name)
    if size is None or _controls(name) or _REF_BAD_CHARS & set(name):
        return "holds a character git refuses in a ref (control, space, ~^:?*[ or backslash)"
    broken = next((why for rule, why in _REF_RULES if rule(name)), None)
    if broken:
        return broken
    if size > MAX_PATH or any(len(p.encode()) > MAX_COMPONENT for p in name.split("/")):
        return f"is too long (a part over {MAX_COMPONENT} bytes or the name over {MAX_PATH})"
    return None


def check_ref(name: object, *, where: str, what: str = "ref name") -> str:
    """A branch or tag name as the Hub returns it, or a revision a user or bundle gives: a slash
    name like `release/v1` is one (it becomes refs/release/v1 in a Hub cache), `../x` is not."""
    problem = ref_problem(name)
    if problem:
        raise BadRefName(_say(where, f"{what} {name!r} {problem}"))
    return cast(str, name)  # ref_problem found none: a str


def check_repo_id(repo_id: object, *, where: str | None = None) -> str:
    """Return `repo_id` if it is a well-formed ``org/name`` (the Hub's rule), else raise `BadRepoId`."""
    if repo_id_problem(repo_id):
        raise BadRepoId(
            _say(where, f"malformed repo id {repo_id!r}: expected <org>/<name>, e.g. kernels-community/activation")
        )
    return cast(str, repo_id)  # repo_id_problem found none: a str


def check_org(org: object, *, where: str) -> str:
    """An org (publisher) name: the first part of a repo id."""
    problem = org_problem(org)
    if problem:
        raise BadRepoId(_say(where, problem))
    return cast(str, org)  # org_problem found none: a str


def check_variant(name: object, *, where: str) -> str:
    """A variant is one directory under build/: the name LOCAL_KERNELS and every view path carry."""
    if not (isinstance(name, str) and _VARIANT_RE.fullmatch(name)) or ".." in name:
        raise BadVariantName(
            _say(where, f"variant name {name!r} is not one plain directory name (letters, digits, '.', '_', '-')")
        )
    return name


# -- the shapes of the upstream's JSON answers -------------------------------------------------

_ABSENT = object()


def hub_date(value: object) -> datetime | None:
    """A Hub timestamp (2026-01-01T00:00:00.000Z, any number of fraction digits) as naive UTC; None if
    it is not one. By hand, not fromisoformat: the Hub's one shape and a bound on its length, where
    fromisoformat takes dates alone, week dates and any length."""
    if not isinstance(value, str) or len(value) > 64:
        return None
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,12}))?(Z|[+-]\d\d:\d\d)?", value)
    if m is None:
        return None
    text = m[1] + (f".{m[2][:6].ljust(6, '0')}" if m[2] else "") + ("+00:00" if m[3] in (None, "Z") else m[3])
    try:
        return datetime.fromisoformat(text).astimezone(UTC).replace(tzinfo=None)
    except ValueError:  # 2026-02-30
        return None


BYTES_MAX = (1 << 63) - 1  # the ledger's integers (SQLite's, PostgreSQL's bigint) hold no more


def _count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= BYTES_MAX


Rule = tuple[Callable[[object], bool], str]
_STR: Rule = (lambda v: isinstance(v, str), "is not a string")
_OPT_STR: Rule = (lambda v: v is _ABSENT or v is None or isinstance(v, str), "is not a string")
_LIST: Rule = (lambda v: isinstance(v, list), "is not a list")
_SIZE: Rule = (_count, "is not a whole number of bytes (0 to 2**63-1)")
_DATE: Rule = (lambda v: hub_date(v) is not None, "is not a date (2026-01-01T00:00:00.000Z)")

# What the mirror reads of each route's answer (DESIGN.md, "The Hub API subset"); other fields pass
# unread. Names and hashes in them are then checked by the check_* above, where they are used.
SHAPES: dict[str, dict[str, Rule]] = {
    "refs": {"branches": _LIST, "tags": _LIST},
    "ref": {"name": _STR, "targetCommit": _STR},
    "info": {"sha": _STR},
    "commit": {"id": _STR, "date": _DATE, "title": _OPT_STR},
    "entry": {"type": (lambda v: v in ("file", "directory"), "is not 'file' or 'directory'"), "path": _STR},
    "file": {"oid": _STR, "size": _SIZE},
    "lfs": {"oid": _STR, "size": _SIZE},
    "overview": {
        "trustedKernelPublisher": (lambda v: v is _ABSENT or v is None or isinstance(v, bool), "is not true or false")
    },
}


def check_shape(doc: object, shape: str, *, where: str, what: str = "the answer") -> dict[str, Any]:
    """`doc` if it is a JSON object whose fields pass SHAPES[shape]; else one line saying which does not."""
    if not isinstance(doc, dict):
        raise UpstreamMalformed(f"{where}: {what} is {json_kind(doc)}, not a JSON object")
    for name, (ok, why) in SHAPES[shape].items():
        value = doc.get(name, _ABSENT)
        if not ok(value):
            said = "is missing" if value is _ABSENT else f"{why} ({_short(value)})"
            raise UpstreamMalformed(f"{where}: {what}: field {name!r} {said}")
    return doc


def check_entry(doc: object, *, where: str, what: str) -> dict[str, Any]:
    """A tree listing's entry: a directory, or a file with its git oid, size and optional LFS record."""
    entry = check_shape(doc, "entry", where=where, what=what)
    if entry["type"] == "file":
        check_shape(entry, "file", where=where, what=what)
        if entry.get("lfs") is not None:
            check_shape(entry["lfs"], "lfs", where=where, what=f"{what} 'lfs'")
    return entry


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def json_kind(value: object) -> str:
    """What a JSON value is, for a line saying it is not what was expected."""
    names = {dict: "a JSON object", list: "a JSON list", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def endpoint_problem(url: str) -> str | None:
    """Why `url` is not an upstream's base URL, http(s)://host[:port][/path]; None when it is one.
    urlsplit and its .port raise ValueError on an unclosed IPv6 bracket (`http://[::1`) or a port that
    is not a number in 0-65535: that was a traceback. Port 0, spaces and controls cannot be dialled."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        return str(e)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        return "not http(s)://host[:port]"
    if port == 0 or _controls(url) or any(c.isspace() for c in url):
        return "port 0, a space or a control character"
    return None


def check_endpoint(url: str, *, where: str) -> str:
    """An upstream URL a user gave, or BadInput in one line naming `where` (an option, HF_ENDPOINT)."""
    if endpoint_problem(url.rstrip("/")):
        raise BadInput(
            f"{where} {url!r} is not an upstream URL: expected http(s)://host[:port], "
            "e.g. https://huggingface.co or http://mirror:8470"
        )
    return url
