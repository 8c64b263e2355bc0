"""One vLLM run, in the vLLM test venv: a tiny Llama, token-id prompts, greedy, logprobs.

    python vllm_run.py OUT.json MODEL_DIR [--dummy] [--compiled] [--hook api [--allow-spawn]]

Writes OUT.json: this process's pid, the greedy token ids, their logprobs and the top-2 margin at each
step (to tell a near tie from a real change), and what
the worker itself reports (its pid, the class of every ``mlp.act_fn`` and norm, the seat handles it holds),
asked through ``LLM.collective_rpc`` so that a worker in another process answers for itself.
``--hook api`` calls ``frt.adapters.vllm_engine.install_load_hook`` here first (FRT_SEATS names the
catalog); a refusal is written as ``{"refused": "<message>"}``. Everything else comes from the env.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

PROMPTS = [[1, 5, 9, 42, 77, 3, 120], [2, 200, 31, 8], [7, 7, 7, 400, 11, 250, 64, 19, 5]]
MAX_TOKENS = 8


def worker_report(worker) -> dict:
    from frt.adapters import vllm_engine

    model = worker.model_runner.get_model()
    acts = {n: type(m).__name__ for n, m in model.named_modules() if n.endswith("mlp.act_fn")}
    norms = {n: type(m).__name__ for n, m in model.named_modules() if n.endswith("norm")}
    return {
        "pid": os.getpid(),
        "act_fn": acts,
        "norms": norms,
        "handles": [{"line": h.line(), "summary": h.summary()} for h in vllm_engine.attached()],
    }


def _margin(step: dict) -> float:
    top = sorted((v.logprob for v in step.values()), reverse=True)
    return top[0] - top[1] if len(top) > 1 else float("inf")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("model")
    ap.add_argument("--compiled", action="store_true")
    ap.add_argument("--dummy", action="store_true", help='load_format="dummy" instead of the checkpoint')
    ap.add_argument("--hook", choices=["none", "api"], default="none")
    ap.add_argument("--allow-spawn", action="store_true")
    a = ap.parse_args()
    out: dict = {"pid": os.getpid()}
    if a.hook == "api":
        from frt.adapters import vllm_engine
        from frt.resolver.errors import BadInput

        try:
            vllm_engine.install_load_hook(
                os.environ["FRT_SEATS"],
                allow_spawn=a.allow_spawn,
                on_attached=lambda h, m: out.setdefault("on_attached", []).append([len(h.records), type(m).__name__]),
            )
        except BadInput as e:
            out["refused"] = f"{type(e).__name__}: {e}"
            with open(a.out, "w") as f:
                json.dump(out, f)
            return
    # collective_rpc sends worker_report to a worker in another process by pickle, which vLLM allows
    # only when asked (a test harness, not a serving setting).
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    t0 = time.perf_counter()
    llm = LLM(
        model=a.model,
        load_format="dummy" if a.dummy else "auto",
        skip_tokenizer_init=True,
        dtype="float32",
        enforce_eager=not a.compiled,
        max_model_len=128,
        max_num_seqs=4,
        seed=0,
        gpu_memory_utilization=0.2,
    )
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=2, detokenize=False)
    results = llm.generate([TokensPrompt(prompt_token_ids=p) for p in PROMPTS], params, use_tqdm=False)
    out["tokens"] = [list(r.outputs[0].token_ids) for r in results]
    out["logprobs"] = [
        [lp[t].logprob for t, lp in zip(r.outputs[0].token_ids, r.outputs[0].logprobs, strict=False)] for r in results
    ]
    out["margins"] = [[_margin(lp) for lp in r.outputs[0].logprobs] for r in results]
    out["workers"] = llm.collective_rpc(worker_report)
    out["seconds"] = round(time.perf_counter() - t0, 2)
    with open(a.out, "w") as f:
        json.dump(out, f)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
