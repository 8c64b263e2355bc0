"""Greedy decode over a transformers StaticCache, step by step eagerly or one captured CUDA graph per step.

Shared by tests/test_seats_gpu.py and bench/seats.py (the bench's "graphs" rows). Why by hand: on the
H200, ``torch.compile(mode="reduce-overhead", fullgraph=True)`` around ``model.forward`` with
``cache_implementation="static"`` failed in transformers 5.17 ("accessing tensor output of CUDAGraphs
that has been overwritten by a subsequent run"; cudagraphs skipped for the cache's mutated inputs).
Here the decode step is the model's own eager forward, captured once with ``torch.cuda.CUDAGraph``,
which is what engines do: seats, their guards and counters run in Python at capture only.

A replay must need no host work, so every input of the step lives in a fixed buffer that the step
itself advances on the device: the token ids (the step writes its argmax there), their positions,
an attention mask over the whole cache (the step opens the next slot), and the step index at which
it stores its token (and, if kept, its logits). The cache's own write position is a device tensor
too (transformers' ``StaticLayer.cumulative_length``, advanced in place by each update). The mask is
handed to the model ready made (a ``{"full_attention": mask}`` dict skips its mask building), boolean
over ``[batch, 1, query, cache]``: True where a query may look.
"""

from __future__ import annotations

import torch

WARMUP = 3  # eager steps before capture: Triton's JIT, cuBLAS handles and lazy inits happen here, not inside it


class StaticDecoder:
    """``run(graphs)`` prefills ``prompt`` eagerly (its greedy token goes to ``first``), then runs
    ``new`` decode steps, each storing the token it predicts in ``tokens`` (and its logits in
    ``logits`` when ``keep_logits``). ``capture()`` first, for graphs.

    The graph records the model as it is at capture: a decoder captured with seats attached replays
    the seats' kernels even after detach. One decoder per (model state, batch)."""

    def __init__(self, model: torch.nn.Module, prompt: torch.Tensor, new: int, keep_logits: bool = False):
        from transformers import StaticCache

        types = set(getattr(model.config, "layer_types", None) or ["full_attention"])
        if types != {"full_attention"}:
            raise ValueError(f"StaticDecoder builds full-attention masks only; this model has {sorted(types)}")
        impl = getattr(model.config, "_attn_implementation", None)
        if impl != "sdpa":  # eager attention adds its mask (a float one); a boolean mask there would mask nothing
            raise ValueError(f"StaticDecoder hands the model a boolean mask, which needs sdpa attention, not {impl!r}")
        if new < WARMUP:
            raise ValueError(f"decode at least {WARMUP} tokens (the warm-up steps write into the same buffers)")
        self.model, self.prompt, self.new = model, prompt, new
        batch, plen = prompt.shape
        dev = prompt.device
        self.max_len = plen + new
        self.cache = StaticCache(config=model.config, max_cache_len=self.max_len)
        self.ids = torch.zeros(batch, 1, dtype=torch.long, device=dev)
        self.first = torch.zeros(batch, 1, dtype=torch.long, device=dev)
        self.pos = torch.zeros(batch, 1, dtype=torch.long, device=dev)
        self.step_i = torch.zeros(1, dtype=torch.long, device=dev)
        self.mask = torch.zeros(batch, 1, 1, self.max_len, dtype=torch.bool, device=dev)
        self.tokens = torch.zeros(batch, new, dtype=torch.long, device=dev)
        self.logits = None
        if keep_logits:
            vocab = model.config.vocab_size  # not the head's weight: a seated head is a Seat
            self.logits = torch.zeros(batch, new, vocab, dtype=torch.float32, device=dev)
        self.graph: torch.cuda.CUDAGraph | None = None

    @torch.no_grad()
    def prefill(self) -> None:
        """Fill the cache with the prompt and set every buffer for step 0 (also after warm-up)."""
        batch, plen = self.prompt.shape
        dev = self.prompt.device
        self.cache.reset()
        causal = torch.ones(plen, self.max_len, dtype=torch.bool, device=dev).tril()
        mask = causal.expand(batch, 1, plen, self.max_len)
        positions = torch.arange(plen, device=dev).expand(batch, plen)
        out = self.model(
            input_ids=self.prompt,
            position_ids=positions,
            attention_mask={"full_attention": mask},
            past_key_values=self.cache,
            use_cache=True,
        )
        self.first.copy_(out.logits[:, -1].argmax(-1, keepdim=True))
        self.ids.copy_(self.first)
        self.pos.fill_(plen)
        self.step_i.zero_()
        self.mask.zero_()
        self.mask[..., :plen] = True

    @torch.no_grad()
    def step(self) -> None:
        """One decode step, entirely in device ops on the buffers (what the graph records)."""
        self.mask.index_fill_(-1, self.pos[0], True)  # this step's own slot: written by the cache update first
        out = self.model(
            input_ids=self.ids,
            position_ids=self.pos,
            attention_mask={"full_attention": self.mask},
            past_key_values=self.cache,
            use_cache=True,
        )
        logits = out.logits[:, -1]
        nxt = logits.argmax(-1, keepdim=True)
        self.tokens.index_copy_(1, self.step_i, nxt)
        if self.logits is not None:
            self.logits.index_copy_(1, self.step_i, logits.unsqueeze(1).float())
        self.ids.copy_(nxt)
        self.pos.add_(1)
        self.step_i.add_(1)

    def capture(self) -> None:
        """Warm up on a side stream (as torch's CUDA graph notes ask), then record one step."""
        self.prefill()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP):
                self.step()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.step()
        torch.cuda.synchronize()

    def run(self, graphs: bool = False) -> torch.Tensor:
        """Prefill, then `decode`: the generated tokens, ``first`` and then the steps', as
        ``generate`` would return them after the prompt."""
        self.prefill()
        return self.decode(graphs)

    def decode(self, graphs: bool = False) -> torch.Tensor:
        """``new`` steps from where `prefill` left the buffers (replays of the captured step with
        ``graphs``). Asynchronous on a GPU: synchronize before reading a clock."""
        if graphs and self.graph is None:
            raise RuntimeError("capture() before decoding with graphs")
        for _ in range(self.new):
            if graphs:
                self.graph.replay()
            else:
                self.step()
        return torch.cat([self.first, self.tokens], dim=1)


def teacher_forced_logits(model: torch.nn.Module, prompt: torch.Tensor, generated: torch.Tensor) -> torch.Tensor:
    """What one plain forward over prompt + generated tokens predicts after each of the generated
    tokens but the last: the logits the decode steps must have produced, step for step (float32)."""
    with torch.no_grad():
        full = torch.cat([prompt, generated[:, :-1]], dim=1)
        out = model(full).logits[:, prompt.shape[1] :]
    return out.float()
