"""Mirrors in tiers as real processes (issue 48): **central** stages from the fake Hub and serves;
**region** is `serve --upstream CENTRAL --allow ORGS`; **cluster** is `serve --upstream REGION --allow ORGS`.
The Hub is stopped once central has staged, with a tripwire on its port: no tier may reach it after.

What central stages: relu v1, activation v1 and v2, layernorm v1 for the x86 CPU target (trust: the
fixture org), and a small model repo. Each tier is a `serving` (tests/support/serve_helpers.py) process."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.cli import X86, run_cli, write_manifest
from tests.support.fakehub import FakeHub, FakeRepo
from tests.support.kernel_fixtures import ACTIVATION, LAYERNORM, ORG, RELU, blob, demo_repos
from tests.support.serve_helpers import Served, Tripwire, serve_env, serving, tripwire_at

MODEL = "acme/tiers-model"  # a model repo: config, an LFS weights file, a README
MODEL_ORG = MODEL.split("/")[0]
KERNELS = {RELU: {"version": 1}, ACTIVATION: {"version": 1}, LAYERNORM: {"version": 1}}  # + activation v2 (a dep)
ALLOW = ("--allow", ORG, "--allow", MODEL_ORG)


def model_repo() -> FakeRepo:
    repo = FakeRepo(MODEL, repo_type="model")
    weights = blob("tiers-weights", 256 * 1024)  # above the LFS threshold: X-Linked-* and a CDN redirect
    repo.commit(
        {"config.json": b'{"model_type": "tiny"}\n', "model.safetensors": weights, "README.md": b"# tiers\n"},
        title="tiny",
    )
    return repo


@dataclass
class Tiers:
    root: Path
    repos: dict[str, FakeRepo]  # what the Hub had, by repo id: the bytes every tier must reproduce
    central_home: Path
    region_home: Path
    cluster_home: Path
    central: Served
    region: Served
    cluster: Served
    hub_tripwire: Tripwire  # on the stopped Hub's port

    def files(self, repo_id: str, ref: str) -> dict[str, bytes]:
        """The Hub's files of `repo_id` at branch `ref`."""
        r = self.repos[repo_id]
        return {p: d for p, d in r.commits[r.branches[ref]].files.items() if d is not None}


def stage_central(root: Path) -> tuple[Path, str, dict[str, FakeRepo]]:
    """Stage central's set from a fake Hub that is stopped on return: (central's home, the Hub's URL, repos)."""
    home = root / "central"
    manifest = write_manifest(root / "central.toml", KERNELS, [X86], trust=[ORG])
    with manifest.open("a") as f:
        f.write(f'\n[models]\n"{MODEL}" = {{ revision = "main" }}\n')
    repos = [*demo_repos(), model_repo()]
    with FakeHub(repos, trusted_orgs=[ORG], page_size=5, redirects=True) as hub:
        p = run_cli("--endpoint", hub.url, "stage", str(manifest), "--json", home=home)
        assert p.returncode == 0, p.stderr + p.stdout[-2000:]
        assert {(r["repo"], r["status"]) for r in json.loads(p.stdout)["rows"]} >= {(RELU, "staged"), (MODEL, "staged")}
        url = hub.url
    return home, url, {r.repo_id: r for r in repos}


def pull_through(home: Path, upstream: str, *args: str) -> contextlib.AbstractContextManager[Served]:
    """A tier below: `serve --upstream UPSTREAM --allow ORGS`, its upstream waits generous for a loaded box
    (a later option of `args` wins)."""
    return serving(home, "--upstream", upstream, *ALLOW, "--upstream-timeout", "30", *args, env=serve_env())


@contextlib.contextmanager
def three_tiers(
    root: Path, *, region_args: tuple[str, ...] = (), cluster_args: tuple[str, ...] = ()
) -> Iterator[Tiers]:
    central_home, hub_url, repos = stage_central(root)
    with contextlib.ExitStack() as stack:
        tripwire = stack.enter_context(tripwire_at(hub_url))
        central = stack.enter_context(serving(central_home))
        region = stack.enter_context(pull_through(root / "region", central.url, *region_args))
        cluster = stack.enter_context(pull_through(root / "cluster", region.url, *cluster_args))
        yield Tiers(root, repos, central_home, root / "region", root / "cluster", central, region, cluster, tripwire)
