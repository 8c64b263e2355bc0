"""`frt-mirror nginx-conf`: a whole nginx.conf for nginx in front of `serve` replicas.

Python answers the API and every file's headers; nginx sends file bodies itself. A replica started with
`serve --accel-redirect PREFIX` answers a GET that nginx forwards with the file's headers and
`X-Accel-Redirect: PREFIX/<blob>`; nginx then serves that blob from an `internal` location aliased onto
the home's store (sendfile, Range). Of a redirecting answer nginx keeps only Content-Type and
Accept-Ranges (ngx_http_upstream_headers_in's `redirect` flag); the internal location adds X-Repo-Commit,
ETag and X-Linked-* back from `$upstream_http_*`, turns off its own ETag and Last-Modified, and takes
Content-Length and Content-Range from the file, so a client sees what `serve` alone sends.
HEAD and everything else is proxied as is. A dead replica is skipped (`proxy_next_upstream`).

A HEAD costs a replica about as much as a GET's headers, and at 64 clients in flight on a small box its
latency is 64 / (HEADs a second Python answers). `--head-cache SECONDS` lets nginx answer repeated HEADs
of a file by commit sha (an immutable URL, what kernels and snapshot_download ask for) from a short
cache: the thundering herd of nodes at job start reaches a replica once per file.

The replicas' commands in the file's comments name the ledger nginx-conf was given (`--ledger URL` or
FRT_LEDGER_URL), so that each one, run as printed, reads the ledger the home was staged into rather than
an empty SQLite file of its own. A URL with a password is not written there: the commands read it from
FRT_LEDGER_URL. Replicas on more than one host need that ledger on a database server: the home's SQLite
file is shared safely only by the processes of one host, so such a config is refused without one.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from frt.resolver.errors import BadInput

from .nginx_heads import MAP_REWRITE, heads_http, heads_locations
from .nginx_s3 import S3Endpoint, render_location, render_upstream

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

DEFAULT_ACCEL = "/_frt_store"
DEFAULT_RUN_DIR = Path("/var/lib/frt-mirror-nginx")
_HOST = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+|\*)")
_PREFIX = re.compile(r"(/[A-Za-z0-9._~-]+)+")
# Characters a path may hold inside nginx's double quotes: `$` would start a variable, `"` and `\` end
# or escape the string, and nginx has no way to write a literal `$` in alias.
_UNQUOTABLE = re.compile(r'[$"\\\x00-\x1f\x7f]')


@dataclass(frozen=True)
class Address:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def check_accel_prefix(prefix: str) -> str:
    """`/_frt_store` (a trailing slash is dropped); raises BadInput."""
    p = prefix.rstrip("/")
    if not _PREFIX.fullmatch(p):
        raise BadInput(
            f"--accel-redirect {prefix!r}: expected a URL path such as {DEFAULT_ACCEL} "
            "(letters, digits, . _ ~ - between slashes)"
        )
    return p


def parse_address(value: str, what: str, default_host: str | None = None) -> Address:
    """HOST:PORT (`[::1]:8471` for IPv6), or PORT alone where `default_host` is given; raises BadInput."""
    host, sep, port = value.rpartition(":")
    if not sep and default_host is not None:
        host, port = default_host, value
    if not _HOST.fullmatch(host or "") or not port.isdigit() or not 1 <= int(port) <= 65535:
        form = "[HOST:]PORT" if default_host is not None else "HOST:PORT"
        raise BadInput(f"{what} {value!r}: expected {form}, e.g. 127.0.0.1:8471")
    return Address(host, int(port))


def on_this_host(host: str) -> bool:
    """Whether a replica at `host` runs on this host: `localhost`, a loopback address, or an address this
    host owns (one it can bind, port 0). Any other name may be any host: no."""
    h = host.strip("[]")
    if h == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(h)
    except ValueError:
        return False
    if ip.is_loopback:
        return True
    with socket.socket(socket.AF_INET6 if ip.version == 6 else socket.AF_INET) as s:
        try:
            s.bind((h, 0))
        except OSError:
            return False
    return True


@dataclass(frozen=True)
class ReplicaLedger:
    """The ledger as the replicas' commands name it: `text`, the URL nginx-conf was given (--ledger,
    FRT_LEDGER_URL), or None for the home's own SQLite file."""

    text: str | None = None

    def __post_init__(self) -> None:
        if self.text is not None and re.search(r"[\x00-\x1f\x7f]", self.text):
            raise BadInput("the ledger URL holds a control character: it cannot be written in a config comment")

    @property
    def url(self) -> URL | None:
        from frt.resolver.ledger.open import ledger_url

        return ledger_url(self.text) if self.text is not None else None

    @property
    def on_server(self) -> bool:
        """A database server every host reaches (PostgreSQL), not a SQLite file."""
        return self.url is not None and self.url.drivername != "sqlite"

    def option(self) -> str:
        """What goes between `--home HOME` and `serve` in each replica's command."""
        url = self.url
        if url is None:
            return ""
        if url.password is not None:
            return ' --ledger "${FRT_LEDGER_URL:?}"'  # the shell stops the command where it is unset
        text = self.text
        assert text is not None  # the url was parsed from it
        db = url.database or ""
        if url.drivername == "sqlite" and not db.startswith(("/", "file:")) and db != ":memory:":
            text = url.set(database=str(Path(db).absolute())).render_as_string(hide_password=False)
        return f" --ledger {shlex.quote(text)}"

    def note(self) -> str:
        """The comment's words on it, after "The replicas, ... (add --workers N ...)"."""
        url = self.url
        if url is None or url.drivername == "sqlite":
            which = "the home's SQLite ledger" if url is None else "the SQLite ledger nginx-conf was given"
            return (
                f", on {which},\n# which only the processes of one host may share (replicas on other "
                "hosts need the ledger on a\n# database server: nginx-conf --ledger postgresql://...):"
            )
        said = ", on the ledger nginx-conf was given"
        if url.password is not None:
            said += (
                f":\n# {url.render_as_string(hide_password=True)}. Its password is not written "
                "in this file: set FRT_LEDGER_URL\n# to that URL, password included, where each "
                "replica runs"
            )
        return said + ":"


def check_replicas_share(upstreams: tuple[Address, ...], ledger: ReplicaLedger) -> None:
    """Several replicas on more than one host share one ledger only on a database server; raises
    BadInput."""
    elsewhere = [str(u) for u in upstreams if not on_this_host(u.host)]
    if len(upstreams) > 1 and elsewhere and not ledger.on_server:
        raise BadInput(
            f"--upstream {', '.join(elsewhere)}: replicas on other hosts than this one cannot "
            "share a SQLite ledger (the home's file over a shared filesystem): give the ledger "
            "on a database server, --ledger postgresql://USER@HOST:PORT/DB or FRT_LEDGER_URL, or "
            "run every replica on this host"
        )


def _quoted(path: Path | str, what: str) -> str:
    text = str(path)
    if _UNQUOTABLE.search(text):
        raise BadInput(
            f"{what} {text!r} cannot be written in an nginx config ($, quotes, backslashes and "
            "control characters): use a path without them"
        )
    return f'"{text}"'


@dataclass(frozen=True)
class NginxSite:
    """What the config says: where clients connect, the replicas, the store nginx reads blobs from,
    and the folder nginx keeps its pid, logs and temp files in."""

    listen: Address
    upstreams: tuple[Address, ...]
    store: Path | S3Endpoint  # the home's store/sha256 as nginx's host sees it, or the object store's endpoint
    run_dir: Path = DEFAULT_RUN_DIR
    accel: str = DEFAULT_ACCEL
    user: str | None = None  # nginx's worker user: one that may read the store
    head_cache: int = 0  # seconds nginx answers a HEAD of a file by commit sha itself; 0: never
    head_map: bool = False  # nginx answers HEADs of stored files by sha from the replicas' map (head_map.py)
    ledger: ReplicaLedger = ReplicaLedger()  # what the replicas' commands say of the ledger
    store_url: str | None = None  # s3://BUCKET/PREFIX: the replicas' --store (with an S3Endpoint store)

    def render(self, home: Path) -> str:
        run, s3 = self.run_dir, self.store if isinstance(self.store, S3Endpoint) else None
        alias = _quoted(f"{self.store}/", "the store") if s3 is None else ""
        _quoted(run, "--run-dir")
        servers = _servers(self.upstreams)
        user = f"user {self.user};\n" if self.user else ""
        ledger = self.ledger.option() + (f" --store {shlex.quote(self.store_url)}" if self.store_url else "")
        writers = [u for u in self.upstreams if on_this_host(u.host)] if self.head_map else []
        if self.head_map and not writers:
            raise BadInput("--head-map: the map is written by a replica on nginx's host: give one --upstream here")
        mapped = f" --head-map {shlex.quote(str(run))}"
        replicas = "\n".join(
            f"#   frt-mirror --home {shlex.quote(str(home))}{ledger} serve --host "
            f"{u.host.strip('[]')} --port {u.port} --accel-redirect {self.accel}{mapped if u in writers else ''}"
            for u in self.upstreams
        )
        return TEMPLATE.format(
            home=home,
            replicas=replicas,
            ledger_note=self.ledger.note(),
            where=(
                "each with a home of its own (nothing is shared but the bucket and the ledger)"
                if s3
                else "on this host or others that mount the same home"
            ),
            run=run,
            user=user,
            servers=servers,
            bodies=(
                f"from the object store at {s3.scheme}://{s3.netloc},\n# by the presigned URLs the replicas give it."
                if s3
                else f"from the store itself:\n# the user its workers run as must be able to read {self.store}."
            ),
            accel_location=(
                render_location(s3, self.accel, file_headers("frt_etag", "frt_"))
                if s3
                else FS_LOCATION.format(
                    accel=self.accel, alias=alias, headers=file_headers("upstream_http_etag", "upstream_http_x_")
                )
            ),
            s3_http=render_upstream(s3, len(self.upstreams)) if s3 else "",
            listen=self.listen,
            tries=2 * len(self.upstreams),
            keepalive=32 * len(self.upstreams),
            heads_http=heads_http(run, self.head_cache, self.head_map),
            map_rewrite=MAP_REWRITE if self.head_map else "",
            heads_locations=heads_locations(alias, self.head_cache, self.head_map),
        )


def _servers(upstreams: tuple[Address, ...]) -> str:
    """The upstream block's servers. A replica that fails is skipped for 5 s (max_fails=1), so a dead one
    costs one failed connect per nginx worker per 5 s, not one per request. But once every replica is marked
    failed, nginx (1.22, ngx_http_upstream_round_robin.c) has no live peer and answers 502 at once, and it
    does so until a mark runs out: 5 s after a replica came back. So each replica is listed a second time as
    a `backup` with max_fails=0, never marked: nginx goes to the backups only when no primary is left, and
    tries each of them, so the first replica back answers the next request. With one replica nginx never
    marks it (a single peer is always tried), and backups would change nothing."""
    primary = [f"    server {u} max_fails=1 fail_timeout=5s;" for u in upstreams]
    if len(upstreams) == 1:
        return primary[0]
    return "\n".join([*primary, *(f"    server {u} backup max_fails=0;" for u in upstreams)])


TEMPLATE = """\
# nginx in front of frt-mirror serve replicas: generated by `frt-mirror nginx-conf` for the home
# {home}
# The replicas, {where} (add --workers N for N processes
# on one port){ledger_note}
{replicas}
# nginx sends blob bodies {bodies}
# Run:  mkdir -p "{run}" && nginx -t -c THIS_FILE && nginx -c THIS_FILE
{user}worker_processes auto;
pid "{run}/nginx.pid";
error_log "{run}/error.log" warn;

events {{
  worker_connections 4096;
}}

http {{
  sendfile on;
  tcp_nopush on;
  server_tokens off;
  default_type application/octet-stream;
  access_log "{run}/access.log" combined buffer=64k flush=1s;
  client_body_temp_path "{run}/client_body";
  proxy_temp_path "{run}/proxy";
  fastcgi_temp_path "{run}/fastcgi";
  uwsgi_temp_path "{run}/uwsgi";
  scgi_temp_path "{run}/scgi";
{heads_http}{s3_http}
  upstream frt_mirror {{
{servers}
    keepalive {keepalive};
    # Below uvicorn's 5 s keep-alive, so nginx never reuses a connection the replica is closing.
    keepalive_timeout 4s;
  }}

  server {{
    listen {listen};

    proxy_http_version 1.1;
    proxy_set_header Connection "";
    # Pagination links (`Link: <url>; rel="next"`) are built from the Host the client sent.
    proxy_set_header Host $http_host;
    proxy_set_header X-Forwarded-For $remote_addr;
    proxy_set_header X-Forwarded-Proto $scheme;
    # Asks the replica for X-Accel-Redirect: a client that reaches a replica directly gets the bytes.
    proxy_set_header X-Sendfile-Type X-Accel-Redirect;
    # A dead or restarting replica: the request goes to the next one. The mirror is read-only, so a
    # POST (paths-info) is as safe to repeat as a GET. Tries: each replica as a server and as a backup.
    proxy_next_upstream error timeout http_502 http_503 non_idempotent;
    proxy_next_upstream_tries {tries};
    proxy_connect_timeout 5s;
    # Bodies serve streams itself (conditional or odd Range requests) pass through, never to disk.
    proxy_max_temp_file_size 0;
{map_rewrite}
    location / {{
      proxy_pass http://frt_mirror;
    }}
{heads_locations}{accel_location}  }}
}}
"""
FS_LOCATION = """
    # Blob bodies, by X-Accel-Redirect only (`internal`: a client asking for it gets a 404).
    location {accel}/ {{
      internal;
      alias {alias};
{headers}    }}
"""


def file_headers(etag: str, prefix: str) -> str:
    """An internal location's headers of a file's answer: nginx's own ETag and Last-Modified off,
    serve's from the variables ETAG and PREFIX{repo_commit, linked_etag, linked_size}."""
    return (
        "      etag off;\n"
        '      add_header Last-Modified "";\n'
        f"      add_header ETag ${etag};\n"
        f"      add_header X-Repo-Commit ${prefix}repo_commit;\n"
        f"      add_header X-Linked-Etag ${prefix}linked_etag;\n"
        f"      add_header X-Linked-Size ${prefix}linked_size;\n"
    )
