"""SGLang adapter: seats attached in SGLang's model-load path, through both doors, with the real sglang.

Runs in the SGLang venv (tests/engines/venv_sglang.sh), never in the main suite's:

    py=$(bash tests/engines/venv_sglang.sh) && FRT_ENGINE_TESTS=sglang \
        $py -m pytest -q tests/engines/test_sglang_engine.py

A full SGLang engine cannot run on this CPU box (its model runner needs CUDA), so each scenario runs in a
fresh interpreter that does what a scheduler process does up to and including ``ModelRunner.load_model``,
with that method's body replaced by a stand-in that loads a tiny transformers Qwen3 (the probes' docstrings
say exactly what is real and what is substituted). frt reaches those interpreters only through what
``frt-mirror env --engine sglang`` prints: PYTHONPATH with frt and its dist-info, FRT_MIRROR_HOME, FRT_SEATS,
SGLANG_PLUGINS; nothing is pip-installed.
"""

from __future__ import annotations

import re
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

# The engine step must fail, not skip, where sglang is missing: this import is the check.
import sglang.srt.plugins  # noqa: F401

from tests.engines.sglang_helpers import HERE, SGLangJob, prepare, read_json, run_py

LINE = re.compile(r"\[frt\.sglang\] (\d+) seats \((.*)\), (\d+) refused")


class Runs:
    """The staged job, and the probe runs started at once, two at a time (each is mostly sglang's import)."""

    def __init__(self, root: Path):
        self.job: SGLangJob = prepare(root)
        self.pool = ThreadPoolExecutor(max_workers=2)
        self.futures: dict[str, Future] = {}
        self.plugin("plugin")
        self.plugin("excluded", SGLANG_PLUGINS="some_other_plugin")
        self.plugin("no_seats", FRT_SEATS=None)
        self.futures["site"] = self.pool.submit(self._site)

    def plugin(self, name: str, **env: str | None) -> None:
        self.futures[name] = self.pool.submit(self._plugin, name, env)

    def _plugin(self, name: str, env: dict) -> tuple[dict, str, list[dict]]:
        out, markers = self.job.root / f"{name}.json", self.job.root / f"markers-{name}"
        p = run_py(
            [str(HERE / "sglang_plugin_probe.py"), str(out)],
            self.job.env(FRT_SEATS_MARKER_DIR=str(markers), **env),
            cwd=self.job.root,
        )
        assert p.returncode == 0, f"{name}: probe failed (rc {p.returncode}):\n{p.stdout[-6000:]}"
        return read_json(out), p.stdout, _markers(markers)

    def _site(self) -> tuple[dict, str, list[dict]]:
        work, markers = self.job.root / "site-work", self.job.root / "markers-site"
        work.mkdir()
        p = run_py(
            [str(HERE / "sglang_site_probe.py"), str(work), str(work / "out.json")],
            self.job.env(FRT_SEATS_MARKER_DIR=str(markers), SGLANG_PLUGINS=None),
            cwd=self.job.root,
        )
        assert p.returncode == 0, f"site probe failed (rc {p.returncode}):\n{p.stdout[-6000:]}"
        return read_json(work / "out.json"), p.stdout, _markers(markers)

    def result(self, name: str) -> tuple[dict, str, list[dict]]:
        return self.futures[name].result()


def _markers(directory: Path) -> list[dict]:
    return [read_json(m) for m in sorted(directory.glob("sglang-*.json"))]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    r = Runs(tmp_path_factory.mktemp("sglang"))
    yield r
    r.pool.shutdown(wait=True, cancel_futures=True)


def test_entry_point_from_pythonpath_hooks_load_model_and_attaches(runs: Runs):
    doc, log, markers = runs.result("plugin")
    python_dir = runs.job.env_doc["env"]["PYTHONPATH"]
    # Found by sglang's own discovery, from the dist-info `frt-mirror env` wrote: no install anywhere.
    assert [(e["name"], e["value"], e["dir"]) for e in doc["entry_points"]] == [
        ("frt", "frt.adapters.sglang_engine:register", python_dir)
    ]
    # One AFTER hook, attributed to our plugin, although load_plugins ran twice (guard reset).
    assert doc["hooks"] == [
        {
            "type": "after",
            "fn": "frt.adapters.sglang_engine.after_load_model",
            "plugin": "frt",
            "dist": doc["entry_points"][0]["dist"],
        }
    ]
    assert doc["wrapped"] and doc["wraps_stand_in"]
    # What the hook relies on holds for the real ModelRunner.load_model: it sets self.model, returns None.
    assert doc["real"] == {"sets_self_model": True, "returns_value": False}
    assert doc["result"] == "None"

    [handle] = doc["handles"][:1]
    assert handle["seats"] > 0 and handle["refused"] == []
    assert handle["summary"]["guarded_calls"] > 0 and handle["summary"]["fallbacks"] == 0
    assert doc["seated_modules"] == ["Seat"]
    assert doc["rel_err"] < 1e-4  # the seated model computes what the original computes
    lines = LINE.findall(log)
    # Two loads (the second is a reload with a new model), one line each: seated once per model.
    assert [int(n) for n, _, _ in lines] == [handle["seats"]] * 2 and doc["handles_after_reload"] == 2
    assert "catalog seats-qwen3.toml" in lines[0][1]
    # Weights still loading in the background (startup overlap): refused with a reason, nothing seated.
    assert doc["handles_after_overlap"] == 2 and "seats not attached: weights load in the background" in log
    assert [(m["engine"], m["pid"], len(m["seats"])) for m in markers] == [("sglang", doc["pid"], handle["seats"])]


def test_sglang_plugins_without_frt_leaves_it_off(runs: Runs):
    doc, log, markers = runs.result("excluded")
    assert [e["name"] for e in doc["entry_points"]] == ["frt"]  # present, but not allowed
    assert doc["hooks"] == [] and not doc["wrapped"]
    assert doc["handles"] == [] and markers == [] and not LINE.search(log)
    assert doc["seated_modules"] == [] and doc["rel_err"] == 0.0


def test_no_frt_seats_is_a_no_op(runs: Runs):
    doc, log, markers = runs.result("no_seats")
    assert [e["name"] for e in doc["entry_points"]] == ["frt"]
    # The plugin ran and chose to add nothing: SGLang's load_model stays as it was.
    assert doc["hooks"] == [] and not doc["wrapped"]
    assert doc["handles"] == [] and markers == [] and not LINE.search(log)
    assert doc["seated_modules"] == [] and doc["rel_err"] == 0.0


def test_sitecustomize_fallback_in_spawned_children(runs: Runs):
    doc, log, markers = runs.result("site")
    site = Path(doc["installed"]).parent
    assert doc["reinstall_same"] and doc["reinstall_untouched"]  # install is idempotent
    assert doc["foreign"].startswith("refused: ") and "not frt's" in doc["foreign"]
    assert doc["foreign_uninstall"] == [] and doc["foreign_kept"]

    for mode in ("dormant", "active"):
        child = doc[mode]
        assert child["start_method"] == "spawn", child
        # Ours is the sitecustomize Python imported, and the distro's later on the path still ran, once.
        assert child["sitecustomize"] == str(site / "sitecustomize.py")
        assert child["chained"] is not None and Path(child["chained"]).parent.name == "distro"
        assert child["chained_ran"] and f"distro-{child['pid']}" in child["distro_marks"]
        assert not child["sglang_imported_at_startup"]  # lazy: no interpreter pays for sglang's import
        assert child["wraps_real"]

    dormant, active = doc["dormant"], doc["active"]
    assert dormant["active"] is False and not dormant["frt_imported_at_startup"]
    assert not dormant["wrapped_by_frt"]
    assert active["active"] is True and active["wrapped_by_frt"]
    assert active["result"] == "None"
    [handle] = active["handles"]
    assert handle["seats"] > 0 and handle["refused"] == []
    assert [int(n) for n, _, _ in LINE.findall(log)] == [handle["seats"]]
    assert [(m["pid"], len(m["seats"])) for m in markers] == [(active["pid"], handle["seats"])]

    # uninstall removes exactly what install wrote, the bytecode Python cached for it, and the
    # directory it created; a second call finds nothing.
    assert sorted(doc["uninstalled"]) == sorted(doc["site_before_uninstall"] + ["site"])
    assert not doc["site_exists_after"] and doc["uninstall_again"] == []
