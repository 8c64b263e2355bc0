"""serve's sockets: bound before anything is printed or started, listening only once serve can answer.

uvicorn binds on its own only once its loop runs: by then serve had said "serving …", and a busy port
came out as uvicorn's own ERROR line and exit 3, which this CLI's contract reads as "upstream
unavailable". Binding here first turns every can't-bind case into one line and exit 2 (bad input).

A socket that listens accepts: the kernel completes the handshake and queues the connection, whoever is
ready to answer it. So serve binds first and listens only once its catalog is loaded (`listen`, from
run.py's serve; with --workers, in each worker, once it has its own): until then a connection is refused,
and a load balancer or a client's retry goes elsewhere, instead of waiting on a replica that may exit 3
(the ledger down at start) without answering. A port some other process listens on is refused at bind.
"""

from __future__ import annotations

import errno
import socket

from frt.resolver.errors import BadInput

BACKLOG = 2048  # uvicorn's own (Config.backlog), which its create_server passes to listen() again


def bind(host: str, port: int) -> list[socket.socket]:
    """One bound socket per address `host` resolves to (as asyncio's create_server would: `localhost` is
    127.0.0.1 and ::1), SO_REUSEADDR on, so a restart does not wait out TIME_WAIT; not listening yet.
    Raises BadInput."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise BadInput(
            f"cannot listen on {host}: {e.strerror} (--host takes an address or a name of this machine)"
        ) from None
    socks: list[socket.socket] = []
    try:
        for family, kind, proto, _, addr in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # else [::] would also take 0.0.0.0's port and clash with it
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(addr)
    except OSError as e:
        for s in socks:
            s.close()
        raise BadInput(_why(e, host, port)) from None
    return socks


def listen(socks: list[socket.socket]) -> None:
    """Start accepting on sockets `bind` gave. Raises BadInput: two serves binding one port at once both
    may (SO_REUSEADDR lets sockets that are not listening share it), and the second to listen fails here."""
    for sock in socks:
        try:
            sock.listen(BACKLOG)
        except OSError as e:
            host, port = sock.getsockname()[:2]
            raise BadInput(_why(e, host, port)) from None


def _why(e: OSError, host: str, port: int) -> str:
    if e.errno == errno.EADDRINUSE:
        return f"port {port} on {host} is in use (another frt-mirror serve? choose another with --port)"
    if e.errno == errno.EACCES:
        return f"not allowed to listen on port {port} on {host} (ports below 1024 need privileges)"
    if e.errno == errno.EADDRNOTAVAIL:
        return f"cannot listen on {host}: not an address of this machine"
    return f"cannot listen on {host}:{port}: {e.strerror or e}"
