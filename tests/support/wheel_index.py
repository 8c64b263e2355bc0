"""A local Python package index for the tests: wheels built here, served over HTTP as PyPI serves them.

`make_wheel` writes a real wheel (a zip with the package, `.dist-info/METADATA`, `WHEEL` and a `RECORD`
of sha256s) that pip installs. `LocalIndex` serves a folder of them as PEP 503 HTML project pages
(links with `#sha256=` and `data-requires-python`, as PyPI writes them), or PEP 691 JSON to a client
that asks for it (`Accept: application/vnd.pypi.simple.v1+json`), with the files under another path
(`/files/`, as PyPI's live on files.pythonhosted.org). Switches: `yanked` (filenames marked
`data-yanked`), `corrupt` (filenames whose served bytes are not the listed ones), `no_hash` (links
without a digest). It records every request path. Nothing here imports frt: it is the upstream.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import threading
import zipfile
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

JSON_TYPE = "application/vnd.pypi.simple.v1+json"


def _normal(name: str) -> str:
    import re

    return re.sub(r"[-_.]+", "-", name).lower()


def make_wheel(
    folder: Path,
    project: str,
    version: str,
    files: dict[str, str],
    *,
    requires: tuple[str, ...] = (),
    tag: str = "py3-none-any",
    requires_python: str | None = None,
) -> Path:
    """A wheel of `project` holding `files` (path in site-packages -> source), installable by pip."""
    dist = f"{project.replace('-', '_')}-{version}"
    path = folder / f"{dist}-{tag}.whl"
    meta = ["Metadata-Version: 2.1", f"Name: {project}", f"Version: {version}"]
    if requires_python:
        meta.append(f"Requires-Python: {requires_python}")
    meta += [f"Requires-Dist: {r}" for r in requires]
    contents = {
        **{k: v.encode() for k, v in files.items()},
        f"{dist}.dist-info/METADATA": ("\n".join(meta) + "\n").encode(),
        f"{dist}.dist-info/WHEEL": (
            f"Wheel-Version: 1.0\nGenerator: frt-tests\nRoot-Is-Purelib: "
            f"{'true' if tag.endswith('none-any') else 'false'}\nTag: {tag}\n"
        ).encode(),
    }
    record = []
    for name, data in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{dist}.dist-info/RECORD,,")
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in contents.items():
            z.writestr(name, data)
        z.writestr(f"{dist}.dist-info/RECORD", "\n".join(record) + "\n")
    return path


@dataclass
class LocalIndex:
    folder: Path  # the wheels it serves, by filename
    yanked: set[str] = field(default_factory=set)
    corrupt: set[str] = field(default_factory=set)
    no_hash: bool = False
    requests: list[str] = field(default_factory=list)

    def __enter__(self) -> LocalIndex:
        index = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                index.requests.append(self.path)
                status, ctype, body = index.answer(self.path, self.headers.get("Accept", ""))
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def wheels(self) -> dict[str, list[Path]]:
        out: dict[str, list[Path]] = {}
        for p in sorted(self.folder.glob("*.whl")):
            out.setdefault(_normal(p.name.split("-", 1)[0]), []).append(p)
        return out

    def answer(self, path: str, accept: str) -> tuple[int, str, bytes]:
        parts = [p for p in path.split("?", 1)[0].split("/") if p]
        if parts[:1] == ["files"] and len(parts) == 2 and (self.folder / parts[1]).is_file():
            data = (self.folder / parts[1]).read_bytes()
            if parts[1] in self.corrupt:
                data = data[:-1] + bytes([data[-1] ^ 1])
            return 200, "application/octet-stream", data
        if parts[:1] != ["simple"] or len(parts) != 2 or parts[1] not in self.wheels():
            return 404, "text/plain", b"Not Found"
        files = self.wheels()[parts[1]]
        if JSON_TYPE in accept:
            doc = {
                "meta": {"api-version": "1.1"},
                "name": parts[1],
                "files": [
                    {
                        "filename": p.name,
                        "url": f"/files/{p.name}",
                        "size": p.stat().st_size,
                        "hashes": {} if self.no_hash else {"sha256": hashlib.sha256(p.read_bytes()).hexdigest()},
                        **({"yanked": True} if p.name in self.yanked else {}),
                    }
                    for p in files
                ],
            }
            return 200, JSON_TYPE, json.dumps(doc).encode()
        links = []
        for p in files:
            frag = "" if self.no_hash else f"#sha256={hashlib.sha256(p.read_bytes()).hexdigest()}"
            yank = ' data-yanked=""' if p.name in self.yanked else ""
            links.append(f'<a href="../../files/{p.name}{frag}"{yank}>{html.escape(p.name)}</a><br/>')
        page = f"<!DOCTYPE html><html><body><h1>Links for {parts[1]}</h1>\n" + "\n".join(links) + "\n</body></html>"
        return 200, "text/html", page.encode()
