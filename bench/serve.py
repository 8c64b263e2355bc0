"""Serving: `frt-mirror serve` (uvicorn) vs. nginx serving the same store blob statically, and nginx in
front of two `serve --accel-redirect` replicas (as `frt-mirror nginx-conf` configures it).

    python -m bench.serve [--quick] [--store s3]

One LFS file (1 GiB; --quick: 64 MiB) of a fixture repo is staged through a fake Hub, which is then
stopped. The three answer the same `/kernels/<repo>/resolve/<sha>/<path>` URL from the same file (so
the same page cache): ours as `frt-mirror serve` in a subprocess; nginx from a config of its own with
`sendfile on` and the headers huggingface_hub needs (X-Repo-Commit, ETag, X-Linked-Etag/-Size); and
nginx from `frt-mirror nginx-conf` over two replicas, where Python answers each HEAD and each GET's
headers and nginx sends the body (X-Accel-Redirect).

Rows: `hf_hub_download` of that file into a fresh cache dir, 3 runs per server, interleaved, median
MB/s (each run is a child process: huggingface_hub's import is not timed, and the client does not share
a GIL with anything), and for scale each server's raw ceiling (curl to /dev/null); then 64 concurrent
keep-alive clients each doing what a client does per file, HEAD then GET, of a second file (16 MiB;
--quick: 2 MiB), 2 rounds each (--quick: 1): total MB/s; then HEAD latency p50/p99 from 64 concurrent
keep-alive clients (raw asyncio streams in a child process), 32,000 HEADs per server (--quick: 1,280).
Latency there is closed-loop: 64 in flight, so p50 ~ 64 / (HEAD/s). 500 per client, not fewer: at
nginx's speed 6,400 HEADs took 50 ms, so its p99 was the clients' start and one scheduling pause.

With `--store s3`, beside them `serve, S3 store`: the same file imported (a bundle of the home) into an
S3 store on a real S3 server started here (SeaweedFS's weed, from the test extra) with the ledger on a
PostgreSQL started here, and served from it by a replica with a home of its own (streamed and hashed as
it goes: mirror/serve/objects.py), so the object store's cost is measured beside the filesystem's; and
`nginx + S3 replicas`: nginx-conf --store over two `serve --accel-redirect` replicas on that store, each
with a home of its own, nginx fetching each body from the store by the presigned URL a replica hands it.

Beside them, `serve, before`: the same serve command from the source at --before REV (by default the
commit before integrity on read), so what hashing the bytes it sends costs is measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.child import run_child

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
REPO, VARIANT, FILENAME = "bench-org/big", "torch-universal", "build/torch-universal/_weights.bin"
SHARD = "build/torch-universal/_shard.bin"  # what the 64 clients fetch
TARGET = "torch2.13-cpu-x86_64-linux"  # any: torch-universal is accepted by every target
CLIENTS, RUNS = 64, 3

NGINX_CONF = """\
daemon off;
{processes}
{user}
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  sendfile on;
  tcp_nopush on;
  keepalive_requests 1000000;
  client_body_temp_path {tmp}/nb; proxy_temp_path {tmp}/np; fastcgi_temp_path {tmp}/nf;
  uwsgi_temp_path {tmp}/nu; scgi_temp_path {tmp}/ns;  # not under /var/lib/nginx
  default_type application/octet-stream;
  server {{
    listen 127.0.0.1:{port};
    location = {url} {{
      alias {blob};
      etag on;
      add_header X-Repo-Commit {sha};
      add_header X-Linked-Etag '"{sha256}"';
      add_header X-Linked-Size {size};
    }}
    location = {shard_url} {{
      alias {shard_blob};
      etag on;
      add_header X-Repo-Commit {sha};
      add_header X-Linked-Etag '"{shard_sha256}"';
      add_header X-Linked-Size {shard};
    }}
  }}
}}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"{what} did not start (exit {proc.poll()})")
            time.sleep(0.05)


def stage_big_file(tmp: Path, size: int, shard: int) -> dict:
    """Stage one fixture repo whose torch-universal build carries a `size`-byte and a `shard`-byte LFS
    file."""
    from tests.support.fakehub import FakeHub, FakeRepo
    from tests.support.kernel_fixtures import variant_files

    payload = hashlib.shake_128(b"bench.serve").digest(size)  # incompressible, ~1 GB/s to make
    extra = {"_weights.bin": payload, "_shard.bin": hashlib.shake_128(b"bench.serve shard").digest(shard)}
    repo = FakeRepo(REPO)
    sha = repo.commit(variant_files("big", VARIANT, version=1, extra=extra), title="big", branch="v1")
    meta, shard_meta = repo.commits[sha].meta[FILENAME], repo.commits[sha].meta[SHARD]
    home = tmp / "home"
    with FakeHub([repo], page_size=1000) as hub:
        stage_v1(home, hub.url, REPO, TARGET)
    blob = home / "store" / "sha256" / meta.sha256[:2] / meta.sha256
    return {
        "home": home,
        "sha": sha,
        "sha256": meta.sha256,
        "size": size,
        "blob": blob,
        "url": f"/kernels/{REPO}/resolve/{sha}/{FILENAME}",
        "shard": shard,
        "shard_sha256": shard_meta.sha256,
        "shard_url": f"/kernels/{REPO}/resolve/{sha}/{SHARD}",
        "shard_blob": home / "store" / "sha256" / shard_meta.sha256[:2] / shard_meta.sha256,
    }


def s3_home(f: dict, tmp: Path, stack: contextlib.ExitStack) -> dict[str, str]:
    """The staged home's bundle imported into an S3 store (weed) with its ledger on PostgreSQL, both started
    here and stopped with `stack`; the environment a replica on it runs with (its home: tmp/s3-home)."""
    from frt.mirror.bundle import bundle, import_bundle
    from frt.mirror.store.home import Home
    from tests.support.pgserver import PgServer
    from tests.support.s3server import S3Server

    pg = stack.enter_context(PgServer())
    s3 = stack.enter_context(S3Server())
    env = {**s3.env(), "FRT_LEDGER_URL": pg.url, "FRT_STORE_URL": s3.new_prefix()}
    os.environ.update(s3.env())
    src = Home(f["home"])
    bundle(tmp / "s3.tar", src)
    src.close()
    dest = Home(tmp / "s3-home", ledger_url=env["FRT_LEDGER_URL"], store_url=env["FRT_STORE_URL"])
    import_bundle(tmp / "s3.tar", dest)
    dest.close()
    (tmp / "s3.tar").unlink()
    return {**env, "home": str(tmp / "s3-home")}


def _s3_environ(env: dict) -> dict:
    """A process's environment on the S3 store s3_home made: the store's, the ledger's and AWS's variables."""
    return {**os.environ, **{k: v for k, v in env.items() if k != "home"}}


def start_serve(
    f: dict, tmp: Path, source: Path | None = None, env: dict | None = None
) -> tuple[subprocess.Popen, str]:
    """`frt-mirror serve` of this checkout, or (`source`: a tree from `checkout_before`) of an earlier one;
    `env`: on the S3 store s3_home made (its home and the variables that name the store and the ledger)."""
    port = free_port()
    cmd, home, name = [str(Path(sys.executable).with_name("frt-mirror"))], str(f["home"]), "serve"
    if env is not None:
        home, name, env = env["home"], "serve-s3", _s3_environ(env)
    if source is not None:
        cmd = [sys.executable, "-c", "import sys; from frt.cli import main; sys.exit(main())"]
        env, name = {**os.environ, "PYTHONPATH": str(source)}, "serve-before"
    with open(tmp / f"{name}.log", "wb") as log:
        proc = subprocess.Popen(
            [*cmd, "--home", home, "serve", "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    wait_listening(port, proc, "frt-mirror serve")
    return proc, f"http://127.0.0.1:{port}"


# The last commit whose serve sent stored bytes unverified (e04a93e brought integrity on read).
BEFORE_INTEGRITY = "090c9a6"


def checkout_before(rev: str, tmp: Path) -> Path:
    """The project's source at `rev`, importable as `frt` from PYTHONPATH (which the editable install's
    finder yields to): `git archive` of it, the top-level folders linked in as frt's subpackages the way
    pyproject's package-dir maps them."""
    src = tmp / f"src-{rev}"
    src.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True)
    if archive.returncode:
        sys.exit(f"--before {rev}: {archive.stderr.decode().strip() or 'git archive failed'}")
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True)
    for sub in ("resolver", "mirror", "seats", "adapters", "manifests"):
        if (src / sub).is_dir() and not (src / "frt" / sub).exists():
            (src / "frt" / sub).symlink_to(src / sub, target_is_directory=True)
    return src


def start_nginx(f: dict, tmp: Path, auto: bool = False) -> tuple[subprocess.Popen, str]:
    """nginx serving the blob statically: one process, as serve is, or (`auto`) nginx-conf's
    `worker_processes auto` under a master, the fronts' own baseline."""
    need_nginx()
    port = free_port()
    if auto:
        tmp = tmp / "static-auto"
        tmp.mkdir()
    processes = (
        "worker_processes auto;  # as nginx-conf's" if auto else "master_process off;  # one process, as serve is"
    )
    conf = tmp / "nginx.conf"
    # As root, nginx drops to `nobody`, who cannot enter the private temp dir: stay root there.
    user = "user root;" if os.geteuid() == 0 else ""
    conf.write_text(NGINX_CONF.format(user=user, tmp=tmp, port=port, processes=processes, **f))
    proc = subprocess.Popen(
        ["nginx", "-p", str(tmp), "-c", str(conf), "-e", str(tmp / "nginx-error.log")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_listening(port, proc, "nginx")
    return proc, f"http://127.0.0.1:{port}"


def need_nginx() -> None:
    if not shutil.which("nginx"):  # Debian's package; CI runs as root (and .ci/run installs it too)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "nginx"]):
            subprocess.run(cmd, check=True, capture_output=True, env=env)


def start_replicas(
    f: dict, tmp: Path, head_map: Path | None, n: int = 2, env: dict | None = None
) -> tuple[list[subprocess.Popen], list[int]]:
    """`n` x `serve --accel-redirect --head-map HEAD_MAP`, each logging to a file (the map is read only
    by the front started with nginx-conf --head-map over that run dir); `env`: on the S3 store s3_home
    made, each with a home of its own, no head map."""
    exe, procs, ports = str(Path(sys.executable).with_name("frt-mirror")), [], []
    name = "replica" if env is None else "s3-replica"
    for i in range(n):
        port = free_port()
        home = f["home"] if env is None else tmp / f"{name}{i}-home"
        with open(tmp / f"{name}{i}.out", "wb") as out:
            procs.append(
                subprocess.Popen(
                    [
                        exe,
                        "--home",
                        str(home),
                        "serve",
                        "--port",
                        str(port),
                        "--accel-redirect",
                        "/_frt_store",
                        "--access-log",
                        str(tmp / f"{name}{i}.log"),
                        *(("--head-map", str(head_map)) if head_map else ()),
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=None if env is None else _s3_environ(env),
                )
            )
        wait_listening(port, procs[-1], "frt-mirror serve --accel-redirect")
        ports.append(port)
    return procs, ports


def start_front(
    f: dict, run: Path, ports: list[int], *conf_args: str, env: dict | None = None
) -> tuple[subprocess.Popen, str]:
    """nginx from `frt-mirror nginx-conf CONF_ARGS` in front of the replicas on `ports` (`env`: on the S3
    store, nginx-conf --store: nginx fetches the bodies from the store)."""
    need_nginx()
    port, exe = free_port(), str(Path(sys.executable).with_name("frt-mirror"))
    run.mkdir(exist_ok=True)  # the replicas may have written the head map into it
    args = [
        exe,
        "--home",
        str(f["home"] if env is None else env["home"]),
        "nginx-conf",
        "--listen",
        f"127.0.0.1:{port}",
        "--run-dir",
        str(run),
        *conf_args,
        *(a for p in ports for a in ("--upstream", f"127.0.0.1:{p}")),
    ]
    args += ["--user", "root"] if os.geteuid() == 0 else []
    conf = subprocess.run(args, capture_output=True, text=True, check=True, env=env and _s3_environ(env)).stdout
    (run / "nginx.conf").write_text(conf)
    proc = subprocess.Popen(
        ["nginx", "-c", str(run / "nginx.conf"), "-e", str(run / "error.log"), "-g", "daemon off;"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_listening(port, proc, "nginx in front of the replicas")
    return proc, f"http://127.0.0.1:{port}"


def child_download(endpoint: str, sha: str, cache: str) -> dict:
    """In a child process: one hf_hub_download into a fresh cache, timed without the import."""
    from huggingface_hub import hf_hub_download

    t0 = time.perf_counter()
    path = hf_hub_download(REPO, FILENAME, repo_type="kernel", revision=sha, cache_dir=cache, endpoint=endpoint)
    return {"wall": time.perf_counter() - t0, "size": os.path.getsize(path)}


def child_heads(port: int, path: str, total: int) -> dict:
    """In a child process: CLIENTS keep-alive connections issuing HEADs back to back; latencies in s."""
    request = (
        f"HEAD {path} HTTP/1.1\r\nHost: bench\r\nUser-Agent: huggingface_hub/2.4.0; python/3.11\r\n"
        "Accept-Encoding: identity\r\nX-HF-Download-Counter: 1\r\n\r\n"
    ).encode()
    latencies: list[float] = []

    async def one_client(n: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)  # one untimed HEAD per connection: connecting is not what is measured
        await reader.readuntil(b"\r\n\r\n")
        for _ in range(n):
            t0 = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            latencies.append(time.perf_counter() - t0)
            if not head.startswith(b"HTTP/1.1 200"):
                raise SystemExit(f"HEAD answered {head[:80]!r}")
        writer.close()

    async def main() -> float:
        t0 = time.perf_counter()
        await asyncio.gather(*(one_client(total // CLIENTS) for _ in range(CLIENTS)))
        return time.perf_counter() - t0

    try:
        import uvloop  # uvicorn[standard] brings it; the client's own overhead should be small

        wall = uvloop.run(main())
    except ImportError:
        wall = asyncio.run(main())
    return {"latencies": latencies, "wall": wall}


def child_fetch(port: int, path: str, size: int, rounds: int) -> dict:
    """In a child process: CLIENTS keep-alive connections, each doing HEAD then GET of `path` `rounds`
    times, bodies counted and dropped (recv_into one buffer: the client's copy is the least it can do)."""
    head_req, get_req = (
        f"{m} {path} HTTP/1.1\r\nHost: bench\r\nAccept-Encoding: identity\r\n\r\n".encode() for m in ("HEAD", "GET")
    )

    async def one_client() -> int:
        loop = asyncio.get_running_loop()
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setblocking(False)
        buf = bytearray(1 << 20)
        pending, got = b"", 0

        async def answer(request: bytes) -> int:  # the Content-Length, once the head is read
            nonlocal pending
            await loop.sock_sendall(sock, request)
            while b"\r\n\r\n" not in pending:
                n = await loop.sock_recv_into(sock, buf)
                if not n:
                    raise SystemExit("connection closed mid-answer")
                pending += bytes(buf[:n])
            head, _, pending = pending.partition(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise SystemExit(f"answered {head[:80]!r}")
            length = int(re.search(rb"(?im)^content-length:\s*(\d+)", head)[1])
            if length != size:
                raise SystemExit(f"Content-Length {length}, not {size}")
            return length

        for _ in range(rounds):
            await answer(head_req)
            left, pending = await answer(get_req) - len(pending), b""
            while left > 0:
                n = await loop.sock_recv_into(sock, buf)
                if not n:
                    raise SystemExit("connection closed mid-body")
                left -= n
            got += size
        sock.close()
        return got

    async def main() -> dict:
        t0 = time.perf_counter()
        total = sum(await asyncio.gather(*(one_client() for _ in range(CLIENTS))))
        return {"bytes": total, "wall": time.perf_counter() - t0}

    try:
        import uvloop

        return uvloop.run(main())
    except ImportError:
        return asyncio.run(main())


def emit(doc: dict) -> None:
    """The child's one result line, written in full: after the HEAD run, print() of the ~140 kB line to a
    pipe the parent was slow to drain stopped at the first partial write (64 KiB) and still exited 0."""
    data = (json.dumps(doc) + "\n").encode()
    while data:
        data = data[os.write(1, data) :]


def stage_v1(home: Path, endpoint: str, repo: str, target: str) -> None:
    """Stage `repo`'s v1 for `target` from `endpoint` into `home`, as `frt-mirror stage` would."""
    from frt.mirror.stage.kernels import stage
    from frt.mirror.store.home import Home
    from frt.resolver.hub import HubClient
    from frt.resolver.resolve import make_request
    from frt.resolver.targets import parse_target

    mirror_home = Home(home)
    report = stage(
        [make_request(repo, version=1)],
        [parse_target(target)],
        home=mirror_home,
        hub=HubClient(endpoint),
        progress=False,
    )
    mirror_home.close()
    if not report.ok:
        sys.exit(f"staging {repo} v1 failed: {report.rows}")


def serve_child(*args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HUB_DISABLE_XET="1", HF_HUB_DISABLE_PROGRESS_BARS="1")
    return run_child("bench.serve", "--child", *args, env=env)


def curl_seconds(url: str, size: int) -> float | None:
    """A raw GET to /dev/null: what the server can push when the client is not the limit (None: no curl)."""
    if not shutil.which("curl"):
        return None
    t0 = time.perf_counter()
    out = subprocess.run(
        ["curl", "-sS", "-o", "/dev/null", "-w", "%{size_download}", url], capture_output=True, text=True, timeout=600
    )
    wall = time.perf_counter() - t0
    if out.returncode or int(out.stdout or 0) != size:
        sys.exit(f"curl {url}: exit {out.returncode}, {out.stdout} bytes: {out.stderr}")
    return wall


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.serve", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a 64 MiB file and 1,280 HEADs per server (< 30 s)")
    ap.add_argument(
        "--before",
        metavar="REV",
        default=None,
        help=f"also serve with the code at REV, as the baseline (default {BEFORE_INTEGRITY}, before "
        "integrity on read; --quick: none); 'none' to leave it out",
    )
    ap.add_argument(
        "--store",
        choices=("files", "s3"),
        default="files",
        help="s3: also serve the file from an S3 store (a SeaweedFS and a PostgreSQL started here): "
        "the row 'serve, S3 store'",
    )
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    before = args.before or ("none" if args.quick else BEFORE_INTEGRITY)
    if args.child:
        kind, *rest = args.child
        if kind == "download":
            return emit(child_download(*rest))
        if kind == "fetch":
            return emit(child_fetch(int(rest[0]), rest[1], int(rest[2]), int(rest[3])))
        return emit(child_heads(int(rest[0]), rest[1], int(rest[2])))

    size, shard, rounds, heads = (
        (64 * MiB, 2 * MiB, 1, 20 * CLIENTS) if args.quick else (1024 * MiB, 16 * MiB, 2, 500 * CLIENTS)
    )
    with tempfile.TemporaryDirectory(prefix="frt-bench-serve-") as tmp_name, contextlib.ExitStack() as stack:
        tmp = Path(tmp_name)
        t0 = time.perf_counter()
        f = stage_big_file(tmp, size, shard)
        stage_s = time.perf_counter() - t0
        servers, procs = {}, []
        starts = [("serve", lambda: start_serve(f, tmp))]
        if args.store == "s3":
            s3_env = s3_home(f, tmp, stack)
            starts.append((S3, lambda: start_serve(f, tmp, env=s3_env)))
        if before != "none":
            source = checkout_before(before, tmp)
            starts.append((BEFORE, lambda: start_serve(f, tmp, source)))
        try:
            for name, start in (
                *starts,
                ("nginx", lambda: start_nginx(f, tmp)),
                (AUTO, lambda: start_nginx(f, tmp, auto=True)),
            ):
                proc, servers[name] = start()
                procs.append(proc)
            replicas, ports = start_replicas(f, tmp, run_dir(tmp, MAPPED))
            procs += replicas
            for name, conf_args in ((FRONT, ()), (CACHED, ("--head-cache", "1")), (MAPPED, ("--head-map",))):
                proc, servers[name] = start_front(f, run_dir(tmp, name), ports, *conf_args)
                procs.insert(0, proc)  # stopped before the replicas
            if args.store == "s3":
                replicas, ports = start_replicas(f, tmp, None, env=s3_env)
                procs += replicas
                proc, servers[S3_FRONT] = start_front(f, run_dir(tmp, S3_FRONT), ports, env=s3_env)
                procs.insert(0, proc)
            results = measure(servers, f, rounds, heads)
            results["before"] = None if before == "none" else before
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=10)
    report(results, f, stage_s, rounds, heads)


FRONT, CACHED, MAPPED, BEFORE = "nginx + 2 replicas", "same + head cache", "same + head map", "serve, before"
S3 = "serve, S3 store"
S3_FRONT = "nginx + S3 replicas"  # nginx-conf --store: nginx fetches each body from the store
FRONTS = (FRONT, CACHED, MAPPED)
AUTO = "nginx, N workers"  # static, as many workers as nginx-conf's nginx: the fronts' HEAD/s baseline


def run_dir(tmp: Path, name: str) -> Path:
    return tmp / name.strip().replace(" ", "-")


def measure(servers: dict, f: dict, rounds: int, heads: int) -> dict:
    walls: dict[str, list[float]] = {name: [] for name in servers}
    for i in range(RUNS):
        for name, url in servers.items():
            cache = Path(tempfile.mkdtemp(prefix=f"frt-bench-cache-{i}-"))
            res = serve_child("download", url, f["sha"], str(cache))
            if res["size"] != f["size"]:
                sys.exit(f"{name}: downloaded {res['size']} bytes, not {f['size']}")
            walls[name].append(res["wall"])
            shutil.rmtree(cache)
    raw = {name: [curl_seconds(url + f["url"], f["size"]) for _ in range(RUNS)] for name, url in servers.items()}
    fetch = {
        name: serve_child("fetch", url.rsplit(":", 1)[1], f["shard_url"], str(f["shard"]), str(rounds))
        for name, url in servers.items()
    }
    lat = {name: serve_child("heads", url.rsplit(":", 1)[1], f["url"], str(heads)) for name, url in servers.items()}
    return {"walls": walls, "raw": raw, "fetch": fetch, "lat": lat, "sha_mbps": sha_mbps(f["blob"])}


def sha_mbps(path: Path) -> float:
    """What serve's integrity on read costs per byte it sends: sha256 of the (cached) blob, one core."""
    h, t0 = hashlib.sha256(), time.perf_counter()
    with open(path, "rb") as fh:
        while chunk := fh.read(4 * MiB):
            h.update(chunk)
    return path.stat().st_size / 1e6 / (time.perf_counter() - t0)


def report(results: dict, f: dict, stage_s: float, rounds: int, heads: int) -> None:
    walls, raw, fetch, lat = results["walls"], results["raw"], results["fetch"], results["lat"]
    size = f["size"]
    mbps = {name: size / 1e6 / statistics.median(w) for name, w in walls.items()}
    print(
        f"serve: one {size // MiB} MiB LFS file of {REPO}, staged in {stage_s:.1f} s; the same store blob "
        f"served by each, loopback"
    )
    print(
        f"  frt-mirror serve: uvicorn, 1 process;  nginx {nginx_version()}: 1 process, sendfile on;  "
        f"{AUTO}: the same, {os.cpu_count()} workers under a master;  "
        f"{FRONT}: nginx-conf's nginx ({os.cpu_count()} workers, sendfile) over 2 x serve --accel-redirect; "
        f"{CACHED.strip()}: the same replicas, nginx-conf --head-cache 1;  "
        f"{MAPPED.strip()}: the same, nginx-conf --head-map (nginx answers HEADs by sha from the replicas' map)"
        + (f";  {BEFORE}: serve as it was at {results['before']} (the baseline)" if results.get("before") else "")
    )
    print(f"\nhf_hub_download into a fresh cache, {RUNS} runs each (interleaved), median:")
    print(f"{'':20} {'MB/s':>8} {'runs (s)':>24}")
    for name in walls:
        print(f"{name:20} {mbps[name]:>8.0f} {' '.join(f'{w:.2f}' for w in walls[name]):>24}")
    ratio = mbps["serve"] / mbps["nginx"]
    print(f"throughput ratio serve/nginx = {ratio:.3f} (target >= 0.8): {'PASS' if ratio >= 0.8 else 'FAIL'}")
    if all(None not in w for w in raw.values()):
        curl = {name: size / 1e6 / statistics.median(w) for name, w in raw.items()}
        print(
            f"  for scale, each server's own ceiling (curl -o /dev/null, median of {RUNS}): "
            + ", ".join(f"{name} {v:.0f} MB/s" for name, v in curl.items())
            + f" = {curl['serve'] / curl['nginx']:.2f}x (serve/nginx)"
        )
    if S3 in mbps:
        print(f"object store, serve S3/serve files (one client) = {mbps[S3] / mbps['serve']:.3f}")
        print(f"object store, {S3_FRONT}/{FRONT} (one client) = {mbps[S3_FRONT] / mbps[FRONT]:.3f}")
    if BEFORE in mbps:
        print(
            f"integrity on read, serve/serve before (one client) = {mbps['serve'] / mbps[BEFORE]:.3f} "
            f"(target >= 0.9): {'PASS' if mbps['serve'] >= 0.9 * mbps[BEFORE] else 'FAIL'}"
        )
    print(
        f"  integrity on read: each serve process hashes a blob as it first sends it (or before a Range or an "
        f"nginx hand-off; sha256 at {results['sha_mbps']:.0f} MB/s on one core here), then checks its key per "
        f"answer and hashes again when it moves or after FRT_SERVE_VERIFY_TTL (mirror/serve/integrity.py)"
    )
    print(f"\n{CLIENTS} concurrent keep-alive clients, each HEAD + GET of a {f['shard'] // MiB} MiB file x {rounds}:")
    print(f"{'':20} {'MB/s':>8} {'/ nginx':>8} {'wall s':>8}")
    agg = {name: r["bytes"] / 1e6 / r["wall"] for name, r in fetch.items()}
    for name, r in fetch.items():
        print(f"{name:20} {agg[name]:>8.0f} {agg[name] / agg['nginx']:>8.3f} {r['wall']:>8.2f}")
    if BEFORE in agg:
        ratio = agg["serve"] / agg[BEFORE]
        print(
            f"integrity on read, serve/serve before at {CLIENTS} clients = {ratio:.3f} (target >= 0.9): "
            f"{'PASS' if ratio >= 0.9 else 'FAIL'}"
        )
    if S3 in agg:
        print(f"object store, serve S3/serve files at {CLIENTS} clients = {agg[S3] / agg['serve']:.3f}")
        print(f"object store, {S3_FRONT}/{FRONT} at {CLIENTS} clients = {agg[S3_FRONT] / agg[FRONT]:.3f}")
    ratio = agg["serve"] / agg["nginx"]
    print(
        f"throughput ratio serve alone/nginx static at {CLIENTS} clients = {ratio:.3f} (target >= 0.8): "
        f"{'PASS' if ratio >= 0.8 else 'FAIL'}"
    )
    for name in FRONTS:
        ratio = agg[name] / agg["nginx"]
        print(
            f"throughput ratio {name.strip()}/nginx static at {CLIENTS} clients = {ratio:.3f} (target >= 0.95): "
            f"{'PASS' if ratio >= 0.95 else 'FAIL'}"
        )
    print(f"\nHEAD latency, {CLIENTS} concurrent keep-alive clients, {heads} HEADs per server:")
    print(f"{'':20} {'p50 ms':>8} {'p99 ms':>8} {'HEAD/s':>8}")
    for name, res in lat.items():
        ms = res["latencies"]
        p50, p99 = pct(ms, 0.5) * 1e3, pct(ms, 0.99) * 1e3
        print(f"{name:20} {p50:>8.2f} {p99:>8.2f} {len(ms) / res['wall']:>8.0f}")
    p99 = pct(lat["serve"]["latencies"], 0.99) * 1e3
    print(f"serve alone HEAD p99 = {p99:.2f} ms (target < 5 ms): {'PASS' if p99 < 5 else 'FAIL'}")
    rate = {name: len(res["latencies"]) / res["wall"] for name, res in lat.items()}
    # The target is on the front built for it (nginx answers HEADs by sha from the replicas' map); the
    # others are printed beside it: every HEAD reaching Python, or a repeat within SECONDS from a cache.
    for name in FRONTS:
        p99 = pct(lat[name]["latencies"], 0.99) * 1e3
        ratio = rate[name] / rate[AUTO]
        judged = name == MAPPED
        print(
            f"HEAD p99 through nginx ({name.strip()}) = {p99:.2f} ms{_verdict(judged, p99 < 5, '< 5 ms')}; "
            f"HEAD/s = {ratio:.3f}x nginx static with as many workers{_verdict(judged, ratio >= 0.8, '>= 0.8')} "
            f"({rate[name] / rate['nginx']:.3f}x the 1-process nginx)"
        )


def _verdict(judged: bool, ok: bool, target: str) -> str:
    if not judged:
        return " (no target here: beside the head map's)"
    return f" (target {target}): {'PASS' if ok else 'FAIL'}"


def nginx_version() -> str:
    out = subprocess.run(["nginx", "-v"], capture_output=True, text=True)
    return out.stderr.strip().rsplit("/", 1)[-1]


if __name__ == "__main__":
    main()
