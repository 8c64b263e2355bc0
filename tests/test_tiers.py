"""Mirrors in tiers (issue 48): central stages from the Hub and serves; region pulls through from central;
cluster pulls through from region (tests/support/tiers.py). With the Hub stopped, unmodified clients at the
cluster work as they do against one mirror: kernels' get_kernel (v1, v2) and `kernels download`,
huggingface_hub's `hf download` and snapshot_download. Also in the huggingface_hub 1.33 venv (hub1).

One three-tier set for the module (each tier a real serve process); the tests that change central
(tamper, unstage, stop) come last in the file or build their own."""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import select

from frt.mirror.schema import Demand
from frt.mirror.serve.demand_rollup import MAX_BODY, MAX_ROWS
from frt.mirror.store.home import Home
from tests.support.cli import run_cli
from tests.support.fakehub import FakeHub
from tests.support.hostile import HostileProxy
from tests.support.kernel_fixtures import ACTIVATION, LAYERNORM, ORG, RELU, X86_CPU, demo_repos
from tests.support.serve_helpers import Served, client_env, raw_http, raw_request, run_client
from tests.support.tiers import MODEL, MODEL_ORG, pull_through, three_tiers

pytestmark = pytest.mark.hub1


TTL = "2"  # the region's and the cluster's --refs-ttl: a withdrawal reaches them within it


@pytest.fixture(scope="module")
def tiers(tmp_path_factory):
    ttl = ("--refs-ttl", TTL)
    with three_tiers(tmp_path_factory.mktemp("tiers"), region_args=ttl, cluster_args=ttl) as t:
        yield t


def tool(name: str, *args: str, url: str, hf_home: Path, cwd: Path | None = None):
    """A console script of this venv (`hf`, `kernels`), as a cluster job runs it."""
    env = client_env(url, hf_home, HF_HUB_DISABLE_UPDATE_CHECK="1", HF_HUB_ETAG_TIMEOUT="60")
    exe = str(Path(sys.executable).with_name(name))
    return subprocess.run([exe, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=180)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


GET_BOTH = f"""
    import kernels
    a = kernels.get_kernel("{ACTIVATION}", version=1)
    b = kernels.get_kernel("{ACTIVATION}", version=2)
    report({{"v1": [a.VERSION, a.REVISION_NOTE, a.VARIANT], "v2": [b.VERSION, b.REVISION_NOTE, b.VARIANT]}})
"""


def test_get_kernel_v1_and_v2_at_the_cluster(tiers, tmp_path):
    p, out = run_client(GET_BOTH, tiers.cluster.url, tmp_path / "hf", timeout=180, HF_HUB_ETAG_TIMEOUT="60")
    assert out == {"v1": [1, "cu-rebuild", X86_CPU], "v2": [2, "v2.1", X86_CPU]}, p.stderr[-3000:]
    assert not tiers.hub_tripwire.hits


def test_kernels_lock_and_download_at_the_cluster(tiers, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        f'[project]\nname = "uses-kernels"\nversion = "0.1"\n\n[tool.kernels.dependencies]\n"{LAYERNORM}" = 1\n'
    )
    url = tiers.cluster.url
    p = tool("kernels", "lock", str(project), url=url, hf_home=tmp_path / "hf")
    assert p.returncode == 0, p.stderr[-3000:]
    locks = {
        e["dependency"]["repo-id"]: e["lock"]["commit"] for e in json.loads((project / "kernels.lock").read_text())
    }
    p = tool("kernels", "download", str(project), url=url, hf_home=tmp_path / "hf-dl")
    assert p.returncode == 0, p.stderr[-3000:]
    for repo, commit in locks.items():
        snap = tmp_path / "hf-dl" / "hub" / f"kernels--{repo.replace('/', '--')}" / "snapshots" / commit
        expect = {k: v for k, v in tiers.repos[repo].commits[commit].files.items() if v is not None}
        got = {str(f.relative_to(snap)): f.read_bytes() for f in (snap / "build" / X86_CPU).iterdir()}
        assert got and all(expect[name] == data for name, data in got.items()), repo
    assert set(locks) == {LAYERNORM, ACTIVATION}  # activation v2: layernorm's kernel-depends
    assert not tiers.hub_tripwire.hits


def test_hf_download_and_snapshot_download_of_a_model_at_the_cluster(tiers, tmp_path):
    expect = {p: sha(d) for p, d in tiers.files(MODEL, "main").items()}
    p = tool(
        "hf", "download", MODEL, "--local-dir", str(tmp_path / "out"), url=tiers.cluster.url, hf_home=tmp_path / "hf"
    )
    assert p.returncode == 0, p.stderr[-3000:]
    got = {
        str(f.relative_to(tmp_path / "out")): sha(f.read_bytes()) for f in (tmp_path / "out").rglob("*") if f.is_file()
    }
    assert {k: v for k, v in got.items() if not k.startswith(".cache")} == expect
    p, out = run_client(
        f"""
        from huggingface_hub import snapshot_download
        report(tree_sha256(snapshot_download({MODEL!r})))
        """,
        tiers.cluster.url,
        tmp_path / "hf2",
        timeout=180,
    )
    assert out == expect, p.stderr[-3000:]
    assert not tiers.hub_tripwire.hits


# -- trust and integrity: carried, never invented -------------------------------------------------


def raw(served, path: str) -> tuple[int, bytes]:
    status, _, body = raw_http(served.port, raw_request("GET", path), timeout=60)
    return status, body


def test_trust_digests_and_pins_reach_the_cluster_as_central_recorded_them(tiers):
    # The publisher's overview: trusted for the fixture org; the model org never vouched for (404 everywhere,
    # not a `false` nor a `true` invented on the way).
    for org in (ORG, MODEL_ORG):
        path = f"/api/organizations/{org}/overview"
        assert raw(tiers.cluster, path)[0] == raw(tiers.region, path)[0] == raw(tiers.central, path)[0]
    status, body = raw(tiers.cluster, f"/api/organizations/{ORG}/overview")
    assert status == 200 and json.loads(body)["trustedKernelPublisher"] is True
    assert raw(tiers.cluster, f"/api/organizations/{MODEL_ORG}/overview")[0] == 404
    # Pins: every version's commit, and the publisher's digest in each variant's metadata.json, byte for byte.
    for repo in (ACTIVATION, LAYERNORM):
        central_refs = json.loads(raw(tiers.central, f"/api/kernels/{repo}/refs")[1])
        assert json.loads(raw(tiers.cluster, f"/api/kernels/{repo}/refs")[1]) == central_refs
        for branch in central_refs["branches"]:
            commit = branch["targetCommit"]
            meta = f"/kernels/{repo}/resolve/{commit}/build/{X86_CPU}/metadata.json"
            status, body = raw(tiers.cluster, meta)
            assert status == 200 and body == raw(tiers.central, meta)[1], (repo, branch)
            assert (
                json.loads(body)["digest"]
                == json.loads(tiers.repos[repo].commits[commit].files[meta.split(f"{commit}/")[1]])["digest"]
            )


def stored(home: Path, data: bytes) -> Path:
    digest = sha(data)
    return home / "store" / "sha256" / digest[:2] / digest


def test_a_tampered_blob_at_central_never_reaches_the_cluster(tiers, tmp_path):
    """An operator's edit at central (a flipped bit): the region refuses what fails its checks, stores
    nothing, and the cluster's client fails as it would against a bad Hub, with no wrong file anywhere."""
    commit = tiers.repos[RELU].branches["v1"]
    path = f"build/{X86_CPU}/__init__.py"
    good = tiers.files(RELU, "v1")[path]
    blob = stored(tiers.central_home, good)
    blob.chmod(0o644)
    bad = bytes([good[0] ^ 0x01]) + good[1:]
    with open(blob, "r+b") as f:  # in place, as `dd conv=notrunc` would: size and name unchanged
        f.write(bad[:1])
    p, out = run_client(
        f"""
        import kernels
        try:
            k = kernels.get_kernel("{RELU}", version=1)
            report({{"loaded": k.REVISION_NOTE}})
        except Exception as e:
            report({{"error": type(e).__name__}})
        """,
        tiers.cluster.url,
        tmp_path / "hf",
        timeout=180,
        HF_HUB_ETAG_TIMEOUT="60",
    )
    assert out is not None and "error" in out, (out, p.stderr[-3000:])
    for served in (tiers.cluster, tiers.region):
        status, body = raw(served, f"/kernels/{RELU}/resolve/{commit}/{path}")
        assert status != 200 and bad not in body, (served.url, status)
    for home in (tiers.region_home, tiers.cluster_home):
        assert not stored(home, bad).exists() and not stored(home, good).exists(), home
    cached = [f for f in (tmp_path / "hf").rglob("__init__.py") if f.is_file() and "relu" in str(f)]
    assert all(f.read_bytes() != bad for f in cached), cached


def flipped_body(h, fwd) -> None:
    """The upstream's answer with one bit of its body flipped, headers (ETag, X-Linked-Etag) kept."""
    f = fwd()
    body = bytes([f.body[0] ^ 0x01]) + f.body[1:] if f.body and h.command == "GET" else f.body
    h.send(f.status, body, f.headers)


def test_a_central_that_sends_wrong_bytes_is_refused_by_the_region(tiers, tmp_path):
    """Central's own check (above) aside: a central that sends other bytes than it listed (an older
    frt-mirror without integrity on read, a broken middlebox) is refused by the region's own verification
    (the listing's LFS sha256) and the cluster never gets them."""
    so = f"build/{X86_CPU}/_activation.abi3.so"
    good = tiers.files(ACTIVATION, "v1")[so]
    with HostileProxy(tiers.central.url) as proxy:
        rule = proxy.rule("/_activation.abi3.so", flipped_body)
        with (
            pull_through(tmp_path / "region", proxy.url) as region,
            pull_through(tmp_path / "cluster", region.url) as cluster,
        ):
            p, out = run_client(
                f"""
                import kernels
                try:
                    report({{"loaded": kernels.get_kernel("{ACTIVATION}", version=1).REVISION_NOTE}})
                except Exception as e:
                    report({{"error": type(e).__name__}})
                """,
                cluster.url,
                tmp_path / "hf",
                timeout=180,
                HF_HUB_ETAG_TIMEOUT="60",
            )
            assert out is not None and "error" in out, (out, p.stderr[-3000:])
            commit = tiers.repos[ACTIVATION].branches["v1"]
            status, body = raw(cluster, f"/kernels/{ACTIVATION}/resolve/{commit}/{so}")
            assert status != 200 and body != good, status
            assert raw(region, f"/kernels/{ACTIVATION}/resolve/{commit}/{so}")[0] == 502  # the region's refusal
            assert proxy.hits(rule) >= 1
    for home in ("region", "cluster"):
        blobs = [f for f in (tmp_path / home / "store").rglob("*") if f.is_file()]
        assert all(f.read_bytes()[1:] != good[1:] for f in blobs), home  # neither the good nor the flipped copy
    cached = [f for f in (tmp_path / "hf").rglob("_activation.abi3.so") if f.is_file()]
    assert cached == [], cached


# -- demand rolls up ---------------------------------------------------------------------------------

CU = "torch2.11-cu130-x86_64-linux"
ARCHS = "8.0,9.0"
KERNELS_UA = "kernels/0.17.2; python/3.11; backend/cu130; platform/x86_64-linux; file_type/kernel; torch/2.11.0"
# A CUDA node as kernels sees one: this box's torch is a CPU build, so the client names CUDA 13.0 and torch
# 2.11 the way kernels reads them (torch.version.cuda, torch.__version__); kernels and huggingface_hub
# themselves are unmodified, and build the User-Agent (HF_HUB_USER_AGENT_ORIGIN's included) as on a GPU.
CUDA_NODE_LOAD = f"""
    import torch
    torch.version.cuda, torch.__version__ = "13.0", "2.11.0"
    import kernels
    try:
        kernels.get_kernel("{ACTIVATION}", version=1)
        report({{"loaded": True}})
    except Exception as e:
        report({{"error": type(e).__name__}})
"""


def test_what_a_cluster_missed_reaches_central_and_its_manifest(tiers, tmp_path):
    """A CUDA node of the cluster, its env from `frt-mirror env --serve CLUSTER --target CU@8.0,9.0`, loads
    activation v1 with kernels: central staged no build for it. The count, with the node's archs (its
    User-Agent's origin), goes cluster -> region -> central as each writes its counts; central's report
    shows it and where it came from, and its manifest stages exactly that."""
    p = run_cli(
        "env", "--serve", tiers.cluster.url, "--target", f"{CU}@9.0,8.0", "--format", "json", home=tiers.cluster_home
    )
    assert p.returncode == 0, p.stderr
    node = json.loads(p.stdout)["env"]
    assert node["HF_HUB_USER_AGENT_ORIGIN"] == f"frt-archs:{ARCHS}", node
    p, out = run_client(
        CUDA_NODE_LOAD,
        node["HF_ENDPOINT"],
        tmp_path / "hf",
        timeout=180,
        HF_HUB_ETAG_TIMEOUT="60",
        HF_HUB_USER_AGENT_ORIGIN=node["HF_HUB_USER_AGENT_ORIGIN"],
    )
    assert out is not None and "error" in out, (out, p.stderr[-3000:])  # no build for it anywhere: a miss
    target = f"{CU}@{ARCHS}"
    deadline = time.monotonic() + 60
    while True:
        p = run_cli("report", "--demand", "--json", home=tiers.central_home)
        lines = [d for d in json.loads(p.stdout or "[]") if (d["repo"], d["target"]) == (ACTIVATION, target)]
        if lines:
            break
        assert time.monotonic() < deadline, (p.stdout, tiers.region.stderr()[-2000:])
        time.sleep(0.5)
    [line] = lines
    assert [(m["asked"], m["outcome"], m["staged_since"]) for m in line["misses"]] == [("v1", "variant", False)]
    cluster, region = (f"{socket.gethostname()}:{srv.port}" for srv in (tiers.cluster, tiers.region))
    assert line["via"] == [f"{cluster} > {region}"], line
    with Home(tiers.central_home).ledger.session(write=False) as s:
        origins = {r.client for r in s.scalars(select(Demand).where(Demand.target == target))}
    assert origins == {f"tier {cluster} > {region}"}, origins
    p = run_cli("report", "--demand", home=tiers.central_home)
    assert target in p.stdout and f"{cluster} > {region}" in p.stdout and "asked at" in p.stdout, p.stdout
    p = run_cli("demand", "manifest", home=tiers.central_home)
    assert p.returncode == 0, p.stderr
    assert f'target = "{target}"' in p.stdout and f'"{ACTIVATION}" = [{{ version = 1 }}]' in p.stdout, p.stdout
    manifest = tmp_path / "demand.toml"
    manifest.write_text(p.stdout)
    with FakeHub(list(tiers.repos.values()), trusted_orgs=[ORG], page_size=5) as hub:
        p = run_cli("--endpoint", hub.url, "stage", str(manifest), "--json", home=tiers.central_home)
    assert p.returncode == 0, p.stderr
    rows = {(r["repo"], r["requested"], r["target"], r["status"]) for r in json.loads(p.stdout)["rows"]}
    assert rows == {(ACTIVATION, "v1", target, "staged")}, rows


def test_the_demand_endpoint_takes_only_bounded_well_formed_counts(tiers):
    """POST /api/frt-mirror/demand: one clear 400 or 413, nothing kept, for what is not counts."""
    path = "/api/frt-mirror/demand"
    row = {"repo": ACTIVATION, "asked": "v9", "target": CU, "outcome": "version", "variant": "", "count": 1}
    row |= {"first": "2026-12-06T00:00:00+00:00", "last": "2026-12-06T00:00:00+00:00", "origin": "x"}
    bad = [
        b"not json",
        json.dumps({"rows": [row] * (MAX_ROWS + 1)}).encode(),
        json.dumps({"rows": [{**row, "count": -1}]}).encode(),
        json.dumps({"rows": [{**row, "repo": "../etc"}]}).encode(),
        json.dumps({"rows": [{**row, "outcome": "staged"}]}).encode(),
        json.dumps({"rows": [{**row, "origin": "x" * 500}]}).encode(),
        json.dumps({"rows": [{**row, "target": "torch2.11-cu130-x86_64-linux@8.0+PTX"}]}).encode(),
        json.dumps({"rows": [{**row, "target": "host"}]}).encode(),
        json.dumps({"rows": [{**row, "target": "not-a-target"}]}).encode(),
    ]
    for body in bad:
        status, headers, _ = raw_http(tiers.central.port, raw_request("POST", path, body=body))
        assert status == 400 and headers["x-error-message"].startswith("demand: "), (body[:60], status)
    status, _, _ = raw_http(tiers.central.port, raw_request("POST", path, body=b" " * (MAX_BODY + 1)))
    assert status == 413
    p = run_cli("report", "--demand", "--json", home=tiers.central_home)
    assert all(m["asked"] != "v9" for d in json.loads(p.stdout or "[]") for m in d["misses"])


def test_a_hub_upstream_sees_one_post_it_answers_404_and_nothing_breaks(tmp_path):
    """A pull-through of the Hub itself hands its counts to it too: the Hub answers 404, serve goes on."""
    with FakeHub(demo_repos(), trusted_orgs=[ORG]) as hub, pull_through(tmp_path / "m", hub.url) as m:
        commit = hub.repos[("kernel", ACTIVATION)].branches["v1"]
        ask = raw_request("GET", f"/api/kernels/{ACTIVATION}/tree/{commit}/build", f"User-Agent: {KERNELS_UA}")
        assert raw_http(m.port, ask, timeout=60)[0] == 200
        deadline = time.monotonic() + 30
        while not (posts := [e for e in hub.request_log if e.method == "POST" and "frt-mirror" in e.path]):
            assert time.monotonic() < deadline
            time.sleep(0.3)
        assert [e.status for e in posts] == [404]
        assert raw_http(m.port, ask, timeout=60)[0] == 200 and "Traceback" not in m.stderr()


# -- withdrawals follow (last: they change central for the module) -------------------------------

GET_V2 = f"""
    import kernels
    try:
        report({{"loaded": kernels.get_kernel("{ACTIVATION}", version=2).REVISION_NOTE}})
    except Exception as e:
        report({{"error": type(e).__name__}})
"""


def v2_answers(tiers, commit: str) -> dict[str, list[int]]:
    """Each tier's status for activation v2's ref, its revision info and one of its files, by sha."""
    paths = [
        f"/api/kernels/{ACTIVATION}/revision/v2",
        f"/api/kernels/{ACTIVATION}/revision/{commit}",
        f"/kernels/{ACTIVATION}/resolve/{commit}/build/{X86_CPU}/metadata.json",
    ]
    return {s.url: [raw(s, p)[0] for p in paths] for s in (tiers.central, tiers.region, tiers.cluster)}


def test_a_version_unstaged_at_central_goes_from_region_and_cluster(tiers, tmp_path):
    commit = tiers.repos[ACTIVATION].branches["v2"]
    p, out = run_client(GET_V2, tiers.cluster.url, tmp_path / "hf", timeout=180, HF_HUB_ETAG_TIMEOUT="60")
    assert out == {"loaded": "v2.1"}, p.stderr[-3000:]  # every tier holds it now
    bundle = tmp_path / "region-before.tar"
    assert run_cli("bundle", str(bundle), home=tiers.region_home).returncode == 0  # the region's, v2 in it
    p = run_cli("unstage", f"{ACTIVATION}@v2", home=tiers.central_home)
    assert p.returncode == 0, p.stderr
    deadline = time.monotonic() + 60  # central's catalog reload, then each tier's refs TTL (2 s)
    while (answers := v2_answers(tiers, commit)) and any(s != [404, 404, 404] for s in answers.values()):
        assert time.monotonic() < deadline, answers
        time.sleep(0.5)
    p, out = run_client(GET_V2, tiers.cluster.url, tmp_path / "hf2", timeout=180, HF_HUB_ETAG_TIMEOUT="60")
    assert out is not None and "error" in out, (out, p.stderr[-3000:])
    time.sleep(float(TTL) + 1)  # past another refresh: still gone
    assert all(s == [404, 404, 404] for s in v2_answers(tiers, commit).values())
    # The region's bundle from before, imported at the cluster: v2 stays withdrawn there.
    p = run_cli("import", str(bundle), "--json", home=tiers.cluster_home)
    assert p.returncode == 0, p.stderr
    assert {(s["repo"], s["requested"]) for s in json.loads(p.stdout)["skipped"]} == {(ACTIVATION, "v2")}, p.stdout
    time.sleep(float(TTL) + 1)
    assert v2_answers(tiers, commit)[tiers.cluster.url] == [404, 404, 404]


# -- faults stay at their tier (last: central stopped for good) ------------------------------------


def test_with_central_stopped_the_region_serves_what_it_has(tiers):
    """Central stopped (its port refuses connections): both tiers below answer what they hold, whole, to
    concurrent clients; a miss is a 503 with Retry-After at once (a client may come back), never a 404 nor
    a wait of --upstream-hold."""
    commit = tiers.repos[ACTIVATION].branches["v1"]
    held = [f"/kernels/{ACTIVATION}/resolve/{commit}/build/{X86_CPU}/{n}" for n in ("__init__.py", "metadata.json")]
    for served in (tiers.region, tiers.cluster):
        for path in held:
            assert raw(served, path)[0] == 200  # pulled by the tests before
    # A file the region lists and never stored (relu's, refused as tampered above), and repos never seen.
    relu = f"build/{X86_CPU}/__init__.py"
    assert not any(stored(h, tiers.files(RELU, "v1")[relu]).exists() for h in (tiers.region_home, tiers.cluster_home))
    misses = [
        f"/kernels/{RELU}/resolve/{tiers.repos[RELU].branches['v1']}/{relu}",
        f"/api/kernels/{ORG}/never-seen/refs",
        f"/api/models/{MODEL_ORG}/never-seen",
    ]
    tiers.central.proc.terminate()
    tiers.central.proc.wait(timeout=30)
    want = {p: tiers.files(ACTIVATION, "v1")[p.split(f"{commit}/")[1]] for p in held}

    def ask(job: tuple[Served, str]) -> tuple[str, str, int, dict, bytes, float]:
        served, path = job
        t0 = time.monotonic()
        status, headers, body = raw_http(served.port, raw_request("GET", path), timeout=60)
        return served.url, path, status, headers, body, time.monotonic() - t0

    jobs = [(s, p) for s in (tiers.region, tiers.cluster) for p in held * 12 + misses * 3]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(ask, jobs))
    failed = [(u, p, s) for u, p, s, _, body, _ in results if p in want and (s != 200 or body != want[p])]
    assert failed == [], failed
    for url, path, status, headers, _, took in (r for r in results if r[1] not in want):
        assert status == 503 and int(headers["retry-after"]) >= 1, (url, path, status, headers)
        assert "unavailable" in headers["x-error-message"] and "x-error-code" not in headers, (url, path, headers)
        assert took < 20, (url, path, took)  # at once: far under the --upstream-hold (120 s)
    # The region's refusal of central's connections is immediate (no retries of a refused connection).
    t0 = time.monotonic()
    status, headers, _ = raw_http(tiers.region.port, raw_request("GET", f"/api/kernels/{ORG}/never-seen-2/refs"))
    assert status == 503 and "cannot be asked" in headers["x-error-message"], (status, headers)
    assert time.monotonic() - t0 < 1
