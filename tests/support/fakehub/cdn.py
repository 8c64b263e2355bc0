"""The fake Hub's CDN: a second host that serves LFS bodies behind expiring signed URLs.

On the real Hub an LFS file's `/resolve` answers 302 to a signed URL on another host (`cdn-lfs*.hf.co`,
`cas-bridge.xethub.hf.co`, …) that expires after about an hour. The CDN is not the Hub: it knows
nothing of repos or commits (no `X-Repo-Commit`), answers in S3/CloudFront style (a 403 with an XML
body and no `X-Error-Code` for an expired or forged URL), and clients reach it without the Hub's
`Authorization` header. Because it is another *host* (127.0.0.2; Linux routes all of 127.0.0.0/8 to
lo), huggingface_hub stops at the 302 for metadata, as it does on the real Hub, instead of following
it as it follows a same-host redirect.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import time
from http.server import ThreadingHTTPServer
from urllib.parse import parse_qs, urlencode

from .wire import BaseHandler, HubError


class UrlSigner:
    """HMAC-signed URLs with an `Expires` unix time, in the shape of CloudFront's signed URLs."""

    def __init__(self, secret: bytes | None = None):
        self.secret = secret or os.urandom(16)

    def sign(self, path: str, params: dict, ttl: float) -> str:
        """`path?params&Expires=…&Signature=…`, valid for at least `ttl` seconds."""
        query = urlencode({**params, "Expires": math.ceil(time.time() + ttl)})
        return f"{path}?{query}&Signature={self._mac(path, query)}"

    def check(self, path: str, raw_query: str) -> str | None:
        """None if the URL is valid now, else why not ("bad signature" / "expired")."""
        query, _, sig = raw_query.rpartition("&Signature=")
        if not query or not hmac.compare_digest(sig, self._mac(path, query)):
            return "bad signature"
        try:
            expires = int(parse_qs(query)["Expires"][-1])
        except (KeyError, ValueError):
            return "bad signature"
        return "expired" if time.time() > expires else None

    def _mac(self, path: str, query: str) -> str:
        return hmac.new(self.secret, f"{path}?{query}".encode(), hashlib.sha256).hexdigest()


class CdnHandler(BaseHandler):
    """`GET|HEAD /cdn/<sha256>?…&Expires=…&Signature=…`: the bytes, with Range; nothing else."""

    server_kind = "cdn"
    server_version = "AmazonS3"

    def _route(self) -> None:
        path, _, raw_query = self.path.partition("?")
        if self.command not in ("GET", "HEAD") or len(self.segs) != 2 or self.segs[0] != "cdn":
            raise HubError(404, None, "NoSuchKey")
        if (why := self.hub._signer.check(path, raw_query)) is not None:
            raise HubError(403, None, "Request has expired" if why == "expired" else "Access Denied")
        obj = self.hub._cdn_objects.get(self.segs[1])
        if obj is None:
            raise HubError(404, None, "NoSuchKey")
        commit, file_path = obj
        headers = {"ETag": f'"{self.segs[1]}"', "Accept-Ranges": "bytes"}
        if disposition := self.query.get("response-content-disposition"):
            headers["Content-Disposition"] = disposition  # S3 echoes it; the client shows the name
        self._serve_bytes(commit.files[file_path], headers)

    def _send_error(self, e: HubError) -> None:
        # S3 / CloudFront errors: XML, no X-Error-Code, so the client cannot map them to Hub errors.
        code = {403: "AccessDenied", 404: "NoSuchKey"}.get(e.status, "ServiceUnavailable")
        body = (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{e.message}</Message></Error>'
        ).encode()
        self._send(e.status, body, dict(e.headers), "application/xml")


def make_cdn_server(hub, host: str, port: int = 0) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer((host, port), CdnHandler)
    server.daemon_threads = True
    server.hub = hub  # type: ignore[attr-defined]
    return server
