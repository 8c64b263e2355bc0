"""Model repos: a manifest's [models] entry staged with include/exclude patterns, then real clients
(`hf download`, snapshot_download, transformers) through `serve` with the upstream gone, the exported
cache with HF_HUB_OFFLINE=1 inside `unshare -n`, and a bundle carried to another home. Also in the
huggingface_hub 1.33 venv (marked hub1); that venv has no transformers, so there only the
transformers loads are skipped."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from frt.manifests import ManifestError, load_manifest
from tests.support.cli import run_cli
from tests.support.fakehub import FakeHub, FakeRepo
from tests.support.model_fixtures import (
    EXCLUDE,
    INCLUDE,
    LOAD,
    TINY_MODEL,
    selected,
    tiny_model_repo,
    write_tiny_model,
)
from tests.support.offline import NO_NET, load_offline
from tests.support.serve_helpers import Tripwire, client_env, run_client, serving, tripwire_at

pytestmark = pytest.mark.hub1

TARGET = "torch2.11-cpu-x86_64-linux"
needs_transformers = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None,
    reason="this venv (huggingface_hub 1.33) has no transformers/torch; the main venv runs these loads",
)


@dataclass
class Staged:
    home: Path
    repo: FakeRepo
    expect: dict  # the logits sum and parameter count the saved model gives
    rows: list[dict]
    tripwire: Tripwire


def _toml(entry: dict) -> str:
    return "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in entry.items()) + " }"


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("models")
    expect = write_tiny_model(tmp / "saved")
    repo = tiny_model_repo(tmp / "saved")
    m = tmp / "m.toml"
    m.write_text(f'[models]\n"{TINY_MODEL}" = {_toml({"revision": "main", "include": INCLUDE, "exclude": EXCLUDE})}\n')
    with FakeHub([repo]) as hub:
        p = run_cli("--endpoint", hub.url, "stage", str(m), "--json", home=tmp / "home")
        assert p.returncode == 0, p.stderr + p.stdout[-2000:]
        upstream = hub.url
    with tripwire_at(upstream) as tripwire:  # the upstream is stopped; any call to it is recorded
        yield Staged(tmp / "home", repo, expect, json.loads(p.stdout)["rows"], tripwire)


@pytest.fixture(scope="module")
def mirror(staged):
    with serving(staged.home) as served:
        yield served


def upstream_sha(staged, path: str) -> str:
    return hashlib.sha256(staged.repo.commits[staged.repo.branches["main"]].files[path]).hexdigest()


def files_under(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".cache" not in p.relative_to(root).parts
    }


def test_stage_fetches_exactly_the_selected_files(staged):
    [row] = staged.rows
    assert row["status"] == "staged" and row["target"] == "model", row
    assert row["commit"] == staged.repo.branches["main"]
    assert row["files"] == len(selected(staged.repo)) == 3  # config, generation_config, model.safetensors
    sizes = [len(staged.repo.commits[row["commit"]].files[p]) for p in selected(staged.repo)]
    assert row["bytes"] == sum(sizes) and max(sizes) > 64 * 1024  # the weights came as an LFS file


def test_hf_download_through_serve(staged, mirror, tmp_path):
    exe = str(Path(sys.executable).with_name("hf"))
    env = client_env(mirror.url, tmp_path / "hf", HF_HUB_DISABLE_UPDATE_CHECK="1")
    p = subprocess.run(
        [exe, "download", TINY_MODEL, "--local-dir", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    assert p.returncode == 0, p.stderr
    assert files_under(tmp_path / "out") == {f: upstream_sha(staged, f) for f in selected(staged.repo)}
    assert not staged.tripwire.hits


def test_snapshot_download_and_excluded_file_through_serve(staged, mirror, tmp_path):
    p, out = run_client(
        f"""
        import hashlib, os
        from huggingface_hub import hf_hub_download, snapshot_download
        from huggingface_hub.errors import EntryNotFoundError
        path = snapshot_download({TINY_MODEL!r})
        got = {{n: hashlib.sha256(open(os.path.join(path, n), "rb").read()).hexdigest()
               for n in sorted(os.listdir(path))}}
        errors = {{}}
        for name in ("vocab.json", "README.md"):
            try:
                hf_hub_download({TINY_MODEL!r}, name)
                errors[name] = None
            except EntryNotFoundError as e:  # RemoteEntryNotFoundError on huggingface_hub >= 1
                errors[name] = "EntryNotFound"
        report({{"files": got, "errors": errors}})
    """,
        mirror.url,
        tmp_path / "hf",
    )
    assert out is not None, p.stderr
    assert out["files"] == {f: upstream_sha(staged, f) for f in selected(staged.repo)}
    assert out["errors"] == {"vocab.json": "EntryNotFound", "README.md": "EntryNotFound"}
    assert not staged.tripwire.hits


def check_load(out: dict | None, staged, stderr: str) -> None:
    assert out is not None, stderr[-3000:]
    assert (out["type"], out["layers"], out["params"]) == ("qwen2", 2, staged.expect["params"])
    assert out["logits_sum"] == pytest.approx(staged.expect["logits_sum"], abs=1e-5)


@needs_transformers
def test_transformers_loads_the_model_through_serve(staged, mirror, tmp_path):
    p, out = run_client(LOAD.format(repo=TINY_MODEL), mirror.url, tmp_path / "hf", timeout=300)
    check_load(out, staged, p.stderr)
    assert not staged.tripwire.hits


def export(staged, out: Path) -> None:
    p = run_cli("export-cache", str(out), "--target", TARGET, home=staged.home)
    assert p.returncode == 0, p.stderr


def test_exported_cache_holds_the_selection_for_every_target(staged, tmp_path):
    export(staged, tmp_path / "cache")
    repo_dir = tmp_path / "cache" / f"models--{TINY_MODEL.replace('/', '--')}"
    sha = staged.repo.branches["main"]
    assert (repo_dir / "refs" / "main").read_text() == sha
    snap = repo_dir / "snapshots" / sha
    assert sorted(p.name for p in snap.iterdir()) == selected(staged.repo)
    assert files_under(snap) == {f: upstream_sha(staged, f) for f in selected(staged.repo)}
    p = load_offline(
        f"""
        import json
        from huggingface_hub import snapshot_download, hf_hub_download
        path = snapshot_download({TINY_MODEL!r})
        try:
            hf_hub_download({TINY_MODEL!r}, "vocab.json")
            err = None
        except Exception as e:
            err = type(e).__name__
        print(json.dumps([path, err]))
    """,
        {"HF_HUB_CACHE": str(tmp_path / "cache")},
    )
    assert p.returncode == 0, p.stderr
    path, err = json.loads(p.stdout.strip().splitlines()[-1])
    assert Path(path) == snap and err == "LocalEntryNotFoundError"


@needs_transformers
def test_transformers_loads_the_exported_cache_offline(staged, tmp_path):
    export(staged, tmp_path / "cache")
    code = "import json\ndef report(obj):\n    print('RESULT' + json.dumps(obj))\n" + textwrap.dedent(
        LOAD.format(repo=TINY_MODEL)
    )
    p = load_offline(code, {"HF_HUB_CACHE": str(tmp_path / "cache")})
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT")]
    check_load(json.loads(lines[-1][6:]) if lines else None, staged, p.stderr)


def test_bundle_import_verify_carry_the_model(staged, tmp_path):
    p = run_cli("bundle", str(tmp_path / "b.tar"), home=staged.home)
    assert p.returncode == 0, p.stderr
    other = tmp_path / "other"
    p = subprocess.run(
        [
            *NO_NET,
            str(Path(sys.executable).with_name("frt-mirror")),
            "--home",
            str(other),
            "import",
            str(tmp_path / "b.tar"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    p = run_cli("verify", "--json", home=other)
    assert p.returncode == 0, p.stdout + p.stderr
    assert json.loads(p.stdout)["model_files"] == 3
    with serving(other) as served:
        q, out = run_client(
            f"""
            import hashlib, os
            from huggingface_hub import snapshot_download
            path = snapshot_download({TINY_MODEL!r})
            report({{n: hashlib.sha256(open(os.path.join(path, n), "rb").read()).hexdigest()
                    for n in sorted(os.listdir(path))}})
        """,
            served.url,
            tmp_path / "hf",
        )
    assert out == {f: upstream_sha(staged, f) for f in selected(staged.repo)}, q.stderr


def test_verify_finds_a_missing_model_blob(staged, tmp_path):
    p = run_cli("bundle", str(tmp_path / "b.tar"), home=staged.home)
    assert p.returncode == 0, p.stderr
    other = tmp_path / "other"
    assert run_cli("import", str(tmp_path / "b.tar"), home=other).returncode == 0
    weights = upstream_sha(staged, "model.safetensors")
    (other / "store" / "sha256" / weights[:2] / weights).unlink()
    p = run_cli("verify", home=other)
    assert p.returncode == 1
    assert f"model {TINY_MODEL}@" in p.stdout and "model.safetensors: no verified blob" in p.stdout


def test_matrix_says_models_have_no_targets(staged):
    p = run_cli("matrix", TINY_MODEL, home=staged.home)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == (
        f"{TINY_MODEL}: a model repo: models have no targets "
        f"(staged: revision main at {staged.repo.branches['main'][:12]})"
    )


@pytest.mark.parametrize(
    "entry, where, what",
    [
        ('{ include = "*.json" }', 'models."acme/m".include', "must be a list of non-empty fnmatch patterns"),
        ('{ include = ["*.json"], exclud = ["x"] }', 'models."acme/m".exclud', "unknown key"),
        ('{ revision = "" }', 'models."acme/m".revision', "must be a non-empty"),
        ('"main"', 'models."acme/m"', "must be an inline table"),
    ],
)
def test_bad_models_entries_are_one_line_with_file_and_line(tmp_path, entry, where, what):
    m = tmp_path / "m.toml"
    m.write_text(f'# models\n[models]\n"acme/m" = {entry}\n')
    with pytest.raises(ManifestError) as e:
        load_manifest(m)
    assert str(e.value).startswith(f"{m}:3: {where}: {what}"), str(e.value)
    p = run_cli("stage", str(m), home=tmp_path / "home")
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [f"frt-mirror: {e.value}"], p.stderr


def test_restage_downloads_nothing_and_a_tag_or_no_match_is_handled(staged, tmp_path):
    repo = tiny_model_repo(staged.home.parent / "saved")
    repo.tag("v1.0", "main")
    m = tmp_path / "m.toml"
    m.write_text(f'[models]\n"{TINY_MODEL}" = {_toml({"revision": "v1.0", "include": INCLUDE, "exclude": EXCLUDE})}\n')
    nothing = tmp_path / "none.toml"
    nothing.write_text(f'[models]\n"{TINY_MODEL}" = {_toml({"include": ["*.gguf"]})}\n')
    with FakeHub([repo]) as hub:
        runs = [run_cli("--endpoint", hub.url, "stage", str(m), "--json", home=tmp_path / "home") for _ in range(2)]
        none = run_cli("--endpoint", hub.url, "stage", str(nothing), "--json", home=tmp_path / "home")
    first, second = (json.loads(p.stdout) for p in runs)
    assert [p.returncode for p in runs] == [0, 0], runs[0].stderr
    assert first["rows"][0]["commit"] == repo.branches["main"] and first["rows"][0]["requested"] == "revision v1.0"
    assert first["downloaded_bytes"] == first["needed_bytes"] > 0 and second["downloaded_bytes"] == 0
    assert none.returncode == 1
    [row] = json.loads(none.stdout)["rows"]
    assert row["status"] == "refused" and "no file matches include ['*.gguf']" in row["detail"]
