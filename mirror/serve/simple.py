"""`/simple/`: a PEP 503 index of the wheels the staged kernels' python-depends need.

pip on a cluster that reaches the mirror installs them with `--index-url http://mirror:8470/simple/`
(`env --serve` prints the line): the same wheels, verified the same way, as the home's find-links
folder (`env`, `export-cache`). Each link carries its sha256 (pip checks it) and the file itself is
sent like every blob serve answers: hashed as it goes or verified before (integrity.py). A project
staged rows need no wheel of is a 404, as on any index.
"""

from __future__ import annotations

from html import escape

from packaging.utils import canonicalize_name
from starlette.responses import HTMLResponse, RedirectResponse, Response

from .blob import FileIntegrity
from .catalog import Catalog
from .objects import ObjectIntegrity, ObjectResponse
from .protocol import HubError

HTML = "text/html; charset=utf-8"


def _page(title: str, links: list[tuple[str, str]]) -> str:
    body = "\n".join(f'<a href="{escape(href)}">{escape(text)}</a><br/>' for href, text in links)
    return (
        f'<!DOCTYPE html>\n<html><head><meta name="pypi:repository-version" content="1.0">'
        f"<title>{escape(title)}</title></head>\n<body><h1>{escape(title)}</h1>\n{body}\n</body></html>\n"
    )


def answer(
    catalog: Catalog, integrity: FileIntegrity | ObjectIntegrity, segs: list[str], method: str
) -> Response | ObjectResponse:
    """`segs`: the path after `simple`. The root, a project page, or a wheel of it."""
    head = method == "HEAD"
    # Links are absolute paths: the raw path's trailing "/" is not seen here (`/simple/einops` and
    # `/simple/einops/` are one page), and a relative link would resolve differently under each.
    if not segs:
        return HTMLResponse(_page("Simple index", [(f"/simple/{p}/", p) for p in sorted(catalog.wheels)]))
    project = segs[0]
    canonical = canonicalize_name(project)
    files = catalog.wheels.get(canonical)
    if files is None:
        raise HubError(404, None, f"{project}: no staged kernel needs it")
    if project != canonical:  # PEP 503: the normalized name is the page's one URL
        return RedirectResponse(
            "/".join(["/simple", canonical, *segs[1:]]) + ("/" if len(segs) == 1 else ""), status_code=301
        )
    if len(segs) == 1:
        return HTMLResponse(
            _page(
                f"Links for {project}",
                [(f"/simple/{project}/{name}#sha256={f.sha256}", name) for name, f in sorted(files.items())],
            )
        )
    f = files.get(segs[1]) if len(segs) == 2 else None
    if f is None:
        raise HubError(404, None, f"{'/'.join(segs)}: not a staged wheel")
    if integrity.refused(f):
        raise integrity.error(f)
    headers = [
        (b"content-type", b"application/octet-stream"),
        (b"etag", f'"{f.sha256}"'.encode()),
        (b"content-length", b"%d" % f.size),
    ]
    return integrity.response(f, 0, f.size, 200, headers, head=head)
