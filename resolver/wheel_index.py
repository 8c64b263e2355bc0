"""A Python package index's project page (the simple API: PEP 503 HTML, PEP 691 JSON), read bounded.

What the mirror needs of an index is one page per project: its files, each with the sha256 the index
vouches for (the URL's `#sha256=` fragment, PEP 691's `hashes`), its Requires-Python and whether it is yanked.
A file the index gives no sha256 for is dropped here: the mirror stores nothing it cannot verify; so is one
whose name could not be a file name in the home. The page is read through `wire.get` (a byte cap, a deadline,
bounded redirects) like every upstream answer, and a page that is neither format is one line naming it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import TYPE_CHECKING
from urllib.parse import urldefrag, urljoin, urlsplit

from packaging.utils import canonicalize_name

from . import wire
from .errors import UpstreamMalformed

if TYPE_CHECKING:
    from .pacing import Pacer

PYPI_SIMPLE = "https://pypi.org/simple/"
JSON_TYPE = "application/vnd.pypi.simple.v1+json"
ACCEPT = f"{JSON_TYPE}, text/html;q=0.1"
_SHA256 = re.compile(r"[0-9a-f]{64}")
# What a file may be called to be kept: it becomes a file name in the home (views/wheels/<filename>).
_FILENAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+!-]{0,250}\.(whl|tar\.gz|zip)")


@dataclass(frozen=True)
class IndexFile:
    filename: str
    url: str  # absolute, without its fragment
    sha256: str
    requires_python: str | None = None
    yanked: bool = False
    size: int | None = None  # PEP 700 (JSON pages); None where the index does not say


def project_url(index: str, project: str) -> str:
    return urljoin(index if index.endswith("/") else index + "/", f"{canonicalize_name(project)}/")


def read_project(
    index: str, project: str, limits: wire.Limits | None = None, pacer: Pacer | None = None
) -> list[IndexFile]:
    """The files the index lists for `project` with a sha256; [] where it has no such project (404)."""
    limits = limits or wire.Limits.from_env()
    url = project_url(index, project)
    what = f"index {url}"
    if urlsplit(url).scheme not in ("http", "https"):
        raise UpstreamMalformed(f"{what}: not an http(s) URL")
    try:
        got = wire.get(
            url, headers={"Accept": ACCEPT}, deadline=limits.deadline(), cap=limits.api_bytes, what=what, pacer=pacer
        )
    except Exception as e:  # huggingface_hub raises its own error types for a 404 from any host
        if getattr(getattr(e, "response", None), "status_code", None) == 404:
            return []
        raise
    body = got.body
    if body.lstrip()[:1] == b"{":
        return _from_json(wire.parse_json(body, what), url, what)
    return _from_html(body, url, what)


def _from_json(doc: object, url: str, what: str) -> list[IndexFile]:
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, list):
        raise UpstreamMalformed(f"{what}: a JSON page without a 'files' list")
    out = []
    for f in files:
        if not isinstance(f, dict) or not isinstance(f.get("filename"), str) or not isinstance(f.get("url"), str):
            raise UpstreamMalformed(f"{what}: a file entry without a filename and url: {str(f)[:80]}")
        sha = (f.get("hashes") or {}).get("sha256") if isinstance(f.get("hashes"), dict) else None
        if not isinstance(sha, str) or not _SHA256.fullmatch(sha) or not _FILENAME.fullmatch(f["filename"]):
            continue
        rp, size = f.get("requires-python"), f.get("size")
        out.append(
            IndexFile(
                f["filename"],
                urldefrag(urljoin(url, f["url"]))[0],
                sha,
                rp if isinstance(rp, str) and rp else None,
                bool(f.get("yanked")),
                size if isinstance(size, int) and size >= 0 else None,
            )
        )
    return out


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[tuple[dict[str, str | None], str]] = []  # each <a>: its attributes, its text
        self._open: dict[str, str | None] | None = None
        self._text = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._open, self._text = dict(attrs), ""

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self._text += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._open is not None:
            self.found.append((self._open, self._text.strip()))
            self._open = None


def _from_html(body: bytes, url: str, what: str) -> list[IndexFile]:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise UpstreamMalformed(f"{what}: the page is neither JSON nor UTF-8 HTML") from None
    parser = _Anchors()
    parser.feed(text)
    out = []
    for attrs, label in parser.found:
        href = attrs.get("href")
        if not href:
            continue
        link, fragment = urldefrag(urljoin(url, href))
        algo, _, digest = fragment.partition("=")
        if algo != "sha256" or not _SHA256.fullmatch(digest):
            continue
        filename = label or link.rsplit("/", 1)[-1]
        if not _FILENAME.fullmatch(filename):
            continue
        out.append(IndexFile(filename, link, digest, attrs.get("data-requires-python") or None, "data-yanked" in attrs))
    return out
