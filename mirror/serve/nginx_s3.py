"""nginx-conf on an object store (`--store s3://…`): nginx fetches object bodies from the store itself.

A replica (serve --accel-redirect PREFIX on the same store) answers a GET nginx forwards with the file's
headers and `X-Accel-Redirect: PREFIX/<path and query of the object's presigned URL>`, once it verified the
object whole (serve/objects.py). nginx's internal location proxies that to the store's endpoint: the body
never passes through a replica, so a replica killed mid-download cuts no client short, and nginx retries
the headers on another replica as for any request. nginx asks the store If-Match the ETag the replica
verified the object under (X-Frt-Object-Etag): an object replaced in the bucket since is the store's 412.
The replica's headers are taken into variables in the location's rewrite phase, before the fetch from the
store replaces `$upstream_http_*` with the store's; the store's own headers are hidden (STORE_HEADERS). A
store that refuses or fails (a 412, an expired signature, an object gone, an endpoint down) sends the
request back to a replica, which streams the object, hashing it, or says what is wrong.

The endpoint is the one a presigned URL of this store names (AWS_ENDPOINT_URL, or the region's AWS host):
signed here as the replicas sign, so that nginx's Host is the signed one.
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from frt.resolver.errors import BadInput

if TYPE_CHECKING:
    from ..store.s3 import S3BlobStore

# A path nginx passes on as it got it: it decodes and re-escapes what it proxies, and a signature is over
# the path as signed.
_PLAIN_PATH = re.compile(r"[A-Za-z0-9._~/-]+")
# The headers S3 servers add that are not the file's (AWS, MinIO, SeaweedFS, Ceph, GCS, R2), hidden from
# clients by name: stock nginx cannot keep only a list. tests/test_s3_nginx.py holds SeaweedFS's answers
# through nginx header for header equal to serve's; another store's own extra header may pass (harmless
# to the clients, which read only the Hub's).
STORE_HEADERS = (
    "ETag",
    "Last-Modified",
    "Accept-Ranges",
    "Content-Type",
    "Content-Disposition",
    "Content-Encoding",
    "Cache-Control",
    "Expires",
    "Vary",
    "Alt-Svc",
    "Strict-Transport-Security",
    "X-Content-Type-Options",
    "X-Xss-Protection",
    "x-amz-request-id",
    "x-amz-id-2",
    "x-amz-version-id",
    "x-amz-delete-marker",
    "x-amz-expiration",
    "x-amz-restore",
    "x-amz-replication-status",
    "x-amz-server-side-encryption",
    "x-amz-server-side-encryption-aws-kms-key-id",
    "x-amz-server-side-encryption-bucket-key-enabled",
    "x-amz-storage-class",
    "x-amz-checksum-sha256",
    "x-amz-checksum-crc32",
    "x-amz-checksum-crc32c",
    "x-amz-checksum-crc64nvme",
    "x-amz-checksum-type",
    "x-amz-mp-parts-count",
    "x-amz-tagging-count",
    "x-amz-object-lock-mode",
    "x-amz-object-lock-retain-until-date",
    "x-amz-object-lock-legal-hold",
    "x-amz-website-redirect-location",
    "x-minio-error-code",
    "x-minio-error-desc",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "Seaweed-X-Amz-Etag",
    "Seaweed-X-Amz-Owner",
    "x-rgw-object-type",
    "x-goog-generation",
    "x-goog-metageneration",
    "x-goog-stored-content-encoding",
    "x-goog-stored-content-length",
    "x-goog-hash",
    "x-goog-storage-class",
    "x-guploader-uploadid",
    "cf-ray",
)


@dataclass(frozen=True)
class S3Endpoint:
    """Where nginx fetches objects: `scheme://netloc`, and the Host the presigned URLs were signed for."""

    scheme: str
    netloc: str  # host[:port], as the URL spells it (the signed Host header)

    @property
    def hostname(self) -> str:
        host = urlsplit(f"//{self.netloc}").hostname or self.netloc
        return f"[{host}]" if ":" in host else host

    @property
    def port(self) -> int:
        return urlsplit(f"//{self.netloc}").port or (443 if self.scheme == "https" else 80)


def store_endpoint(store: S3BlobStore) -> S3Endpoint:
    """The endpoint of `store` (a home's store's `objects`), read off a presigned URL signed here, once the store
    answered a listing with these credentials (nginx fetches by the URLs the replicas sign: a store that
    refuses them would only show in nginx's error log); raises BadInput, or StoreUnavailable."""
    import obstore

    store.check()
    probe = store.key("0" * 64)
    try:
        url = urlsplit(obstore.sign(store.client, "GET", probe, timedelta(seconds=60)))
    except Exception as e:  # noqa: BLE001  (obstore's errors: no credentials, a bad region)
        said = str(e).split("\n")[0]
        raise BadInput(f"--store {store.url}: cannot sign a URL for nginx to fetch objects by: {said}") from None
    if url.scheme not in ("http", "https") or not url.netloc:
        raise BadInput(f"--store {store.url}: the store's presigned URLs are not http(s) URLs: {url.geturl()[:80]}")
    if not _PLAIN_PATH.fullmatch(url.path):
        raise BadInput(
            f"--store {store.url}: its object URLs ({url.path}) hold characters nginx would re-spell on the "
            "way to the store, breaking their signatures: use a bucket and prefix of letters, digits, . _ ~ -"
        )
    return S3Endpoint(url.scheme, url.netloc)


def _ca_file() -> str:
    paths = ssl.get_default_verify_paths()
    return paths.cafile or paths.openssl_cafile or "/etc/ssl/certs/ca-certificates.crt"


def render_upstream(ep: S3Endpoint, replicas: int) -> str:
    return f"""
  upstream frt_s3 {{
    server {ep.hostname}:{ep.port};
    keepalive {32 * replicas};
  }}
  # An object's answer from the store is a 200 without the Accept-Ranges serve sends (the replica's goes
  # along with a 206 only, as with the filesystem store's static answers).
  map $status $frt_s3_ranges {{
    200 bytes;
    default "";
  }}
"""


def render_location(ep: S3Endpoint, accel: str, file_headers: str) -> str:
    tls = (
        "      proxy_ssl_server_name on;\n"
        f"      proxy_ssl_name {ep.hostname};\n"
        "      proxy_ssl_verify on;\n"
        f'      proxy_ssl_trusted_certificate "{_ca_file()}";\n'
        if ep.scheme == "https"
        else ""
    )
    hidden = "".join(f"      proxy_hide_header {h};\n" for h in STORE_HEADERS)
    return f"""
    # Blob bodies, by X-Accel-Redirect only (`internal`: a client asking for it gets a 404): the object at
    # the presigned URL the replica gave, fetched from the store by nginx. The replica's headers are kept
    # first: once nginx asks the store, $upstream_http_* are the store's.
    location {accel}/ {{
      internal;
      set $frt_etag $upstream_http_etag;
      set $frt_repo_commit $upstream_http_x_repo_commit;
      set $frt_linked_etag $upstream_http_x_linked_etag;
      set $frt_linked_size $upstream_http_x_linked_size;
      set $frt_object_etag $upstream_http_x_frt_object_etag;
      proxy_pass {ep.scheme}://frt_s3/;
      proxy_set_header Host "{ep.netloc}";
      proxy_set_header Connection "";
      # The client's token is the mirror's, not the store's (a presigned URL with one is refused).
      proxy_set_header Authorization "";
      proxy_set_header Cookie "";
      # The object as the replica verified it: one replaced since is a 412, streamed by a replica instead.
      proxy_set_header If-Match $frt_object_etag;
{tls}      proxy_headers_hash_bucket_size 128;  # room for the hidden names below
      proxy_headers_hash_max_size 1024;
{hidden}      # The store refused or failed: a replica answers instead (it streams the object, or says why not).
      proxy_intercept_errors on;
      error_page 400 403 404 409 412 500 502 503 504 = @frt_stream;
{file_headers}      add_header Accept-Ranges $frt_s3_ranges;
    }}

    location @frt_stream {{
      proxy_set_header Host $http_host;
      proxy_set_header Connection "";
      proxy_set_header X-Forwarded-For $remote_addr;
      proxy_set_header X-Forwarded-Proto $scheme;
      proxy_set_header X-Sendfile-Type "";
      proxy_pass http://frt_mirror$request_uri;
    }}
"""
