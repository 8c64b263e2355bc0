"""Fixture kernels for seats: real, pure-torch kernels in the Hub layout, staged by the real stager.

Each repo is a `kernels` package (``__init__.py`` + ``layers.py`` + ``metadata.json``) in noarch
``torch-universal`` / ``torch-cpu`` variants. Layers are kernels-style: ``nn.Module`` subclasses with
no ``__init__``, forward only, the same forward signature as the module they replace, reading
weights from ``self`` (the original module, as ``kernels.kernelize`` binds them). Functions follow
the seat kinds' conventions (``linear(x, weight, bias)``, ``rms_norm(x, weight, eps)``, ``silu(x)``).

- ``seat-rmsnorm``: RMSNorm (layer and function), torch-universal.
- ``seat-activation``: SiLU / SiLU-and-mul (layers and functions) and a gated MLP block layer
  (``mlp`` seats), torch-cpu.
- ``seat-linear``: a dense projection that keeps the bias (layer and function), torch-cpu and
  torch-universal; v2 exists upstream but the tests stage only v1 (an unstaged version).
- ``seat-experts``: a gather-based expert bank for decode-sized batches, torch-universal; it takes
  silu_and_mul from ``seat-activation`` through metadata ``kernel-depends`` (staged with it).
- ``seat-wrong``: deliberately wrong: an "RMSNorm" that centres the mean (a LayerNorm) and a linear
  that drops the bias. Parity must refuse both (the second only where a bias exists).

- ``seat-triton``: Triton kernels in a noarch ``torch-cuda`` variant (fused RMSNorm: one program per
  row, fp32 statistics; SiLU and SiLU-and-mul), staged only where the host is a CUDA one.
- ``seat-triton-sm80``: the same sources, but its metadata declares CUDA archs ``["8.0"]`` (a plain
  cubin list): on a Hopper device the seat must refuse it, as `kernels` itself would.

- ``liger-kernels``: Liger-Kernel's own Triton RMSNorm and SwiGLU from its wheel, in a ``torch-cuda``
  variant (tests/support/liger_fixture.py), staged where the host is a CUDA one and the wheel is at hand.

The compiled CPU arch variant (C++, ``torch.utils.cpp_extension``, cached between runs) lives apart,
in tests/support/seat_fixtures_compiled.py: staging it here would make every seat test wait for a compiler.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.fakehub import FakeRepo
from tests.support.kernel_fixtures import ORG
from tests.support.liger_fixture import LIGER

RMSNORM, ACTIVATION, LINEAR = f"{ORG}/seat-rmsnorm", f"{ORG}/seat-activation", f"{ORG}/seat-linear"
EXPERTS, WRONG = f"{ORG}/seat-experts", f"{ORG}/seat-wrong"
TRITON, TRITON_SM80 = f"{ORG}/seat-triton", f"{ORG}/seat-triton-sm80"
STAGED = (RMSNORM, ACTIVATION, LINEAR, EXPERTS, WRONG)  # each at version 1
STAGED_CUDA = (TRITON, TRITON_SM80)  # only where the host target is a CUDA one: they have no other build

_HEADER = '"""Fixture kernel {name}, built by frt-mirror\'s seat tests."""\n\nimport torch\n'

# The RMSNorm layer, the same in the pure-torch and the Triton package (each calls its own rms_norm).
_RMSNORM_LAYER = """

class RMSNorm(torch.nn.Module):
    can_torch_compile = True
    has_backward = False

    def forward(self, hidden_states):
        from . import rms_norm

        return rms_norm(hidden_states, self.weight, self.variance_epsilon)
"""

# The activation layers, the same in the pure-torch and the Triton package (each calls its own functions).
_ACTIVATION_LAYERS = '''

class SiLU(torch.nn.Module):
    can_torch_compile = True
    has_backward = False

    def forward(self, input):
        from . import silu

        return silu(input)


class SiluAndMul(torch.nn.Module):
    can_torch_compile = True
    has_backward = False

    def forward(self, x):
        from . import silu_and_mul

        return silu_and_mul(x)


class GatedMLP(torch.nn.Module):
    """A whole gated MLP block (an ``mlp`` seat): the block's own projections, this package's SiLU."""

    can_torch_compile = True
    has_backward = False

    def forward(self, x):
        from . import silu

        return self.down_proj(silu(self.gate_proj(x)) * self.up_proj(x))
'''

SOURCES: dict[str, dict[str, str]] = {
    "seat-rmsnorm": {
        "__init__.py": """
from . import layers


def rms_norm(x, weight, eps):
    y = x.float()
    y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)
    return weight * y.to(x.dtype)
""",
        "layers.py": _RMSNORM_LAYER,
    },
    "seat-activation": {
        "__init__.py": """
from . import layers


def silu(x):
    return x * torch.sigmoid(x)


def silu_and_mul(x):
    d = x.shape[-1] // 2
    return silu(x[..., :d]) * x[..., d:]
""",
        "layers.py": _ACTIVATION_LAYERS,
    },
    "seat-linear": {
        "__init__.py": """
from . import layers


def linear(x, weight, bias):
    y = torch.matmul(x, weight.t())
    return y if bias is None else y + bias
""",
        "layers.py": """

class Linear(torch.nn.Module):
    can_torch_compile = True
    has_backward = False

    def forward(self, input):
        from . import linear

        return linear(input, self.weight, self.bias)
""",
    },
    "seat-experts": {
        "__init__.py": '''
import kernels

from . import layers

# A kernel dependency, resolved by the loader from metadata.json kernel-depends (staged, never fetched).
_act = kernels.get_kernel_dep("kernels-test/seat-activation")


def expert_bank(hidden, top_k_index, top_k_weights, gate_up_proj, down_proj):
    """Gather each token's experts and run them as batched GEMVs: the decode-sized shape."""
    gate_up = torch.einsum("th,tkoh->tko", hidden, gate_up_proj[top_k_index])
    act = _act.silu_and_mul(gate_up)
    out = torch.einsum("tki,tkhi->tkh", act, down_proj[top_k_index])
    return (out * top_k_weights.unsqueeze(-1).to(out.dtype)).sum(1).to(hidden.dtype)
''',
        "layers.py": """

class ExpertBank(torch.nn.Module):
    can_torch_compile = True
    has_backward = False

    def forward(self, hidden_states, top_k_index, top_k_weights):
        from . import expert_bank

        return expert_bank(hidden_states, top_k_index, top_k_weights, self.gate_up_proj, self.down_proj)
""",
    },
    "seat-wrong": {
        "__init__.py": """
from . import layers


def linear_drops_bias(x, weight, bias):
    return torch.matmul(x, weight.t())
""",
        "layers.py": '''

class RMSNorm(torch.nn.Module):
    """Wrong on purpose: centres the mean (a LayerNorm), which an RMSNorm must not."""

    can_torch_compile = True
    has_backward = False

    def forward(self, hidden_states):
        y = hidden_states.float()
        y = y - y.mean(-1, keepdim=True)
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * y.to(hidden_states.dtype)
''',
    },
    "seat-triton": {
        "__init__.py": """
import triton
import triton.language as tl

from . import layers


@triton.jit
def _rms_norm_rows(x_ptr, w_ptr, out_ptr, stride_x, stride_out, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    # As transformers' RMSNorm rounds: normalise in fp32, cast to the input dtype, then scale.
    y = (x * rstd).to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (w * y).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _silu(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, (x / (1.0 + tl.exp(-x))).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _silu_and_mul(x_ptr, out_ptr, stride_x, stride_out, d, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    a = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(x_ptr + row * stride_x + d + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (a / (1.0 + tl.exp(-a)) * b).to(out_ptr.dtype.element_ty),
             mask=mask)


def rms_norm(x, weight, eps):
    rows = x.reshape(-1, x.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    if rows.shape[0]:
        _rms_norm_rows[(rows.shape[0],)](rows, weight, out, rows.stride(0), out.stride(0), rows.shape[1], eps,
                                         BLOCK=triton.next_power_of_2(rows.shape[1]))
    return out.reshape(x.shape)


def silu(x):
    flat = x.contiguous()
    out = torch.empty_like(flat)
    n = flat.numel()
    if n:
        _silu[(triton.cdiv(n, 1024),)](flat, out, n, BLOCK=1024)
    return out.reshape(x.shape)


def silu_and_mul(x):
    d = x.shape[-1] // 2
    rows = x.reshape(-1, x.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty((rows.shape[0], d), dtype=x.dtype, device=x.device)
    if rows.shape[0] and d:
        block = min(1024, triton.next_power_of_2(d))
        _silu_and_mul[(rows.shape[0], triton.cdiv(d, block))](rows, out, rows.stride(0), out.stride(0), d,
                                                              BLOCK=block)
    return out.reshape(*x.shape[:-1], d)
""",
        "layers.py": _RMSNORM_LAYER + _ACTIVATION_LAYERS,
    },
}


def _variant(
    name: str,
    variant: str,
    version: int,
    depends: list | None = None,
    source: str | None = None,
    archs: list[str] | None = None,
) -> dict[str, bytes]:
    backend: dict = {"type": "cuda" if variant.startswith("torch-cuda") else "cpu"}
    if archs:
        backend["archs"] = archs
    meta = {
        "id": f"_{name.replace('-', '_')}_v{version}_{variant.replace('-', '_')}",
        "name": name,
        "version": version,
        "license": "apache-2.0",
        "python-depends": [],
        "backend": backend,
    }
    if depends:
        meta["kernel-depends"] = depends
    files = {f"build/{variant}/metadata.json": json.dumps(meta, indent=2).encode()}
    for rel, body in SOURCES[source or name].items():
        files[f"build/{variant}/{rel}"] = (_HEADER.format(name=name) + body).encode()
    return files


def _repo(
    name: str,
    variants: list[str],
    versions: tuple[int, ...] = (1,),
    depends: list | None = None,
    source: str | None = None,
    archs: list[str] | None = None,
) -> FakeRepo:
    repo = FakeRepo(f"{ORG}/{name}")
    for version in versions:
        files: dict = {"README.md": f"# {name}\n".encode()}
        for v in variants:
            files.update(_variant(name, v, version, depends, source, archs))
        repo.commit(files, title=f"{name} v{version}", branch=f"v{version}")
    repo.branch("main", f"v{versions[-1]}")
    return repo


_LIGER: dict[str, object] = {}


def liger_problem() -> str | None:
    """Why the Liger kernel cannot be packaged here (no liger-kernel 0.8.5 found), or None."""
    from tests.support.liger_fixture import LigerUnavailable, liger_source

    if "source" not in _LIGER:
        try:
            _LIGER["source"], _LIGER["problem"] = liger_source(), None
        except LigerUnavailable as e:
            _LIGER["source"], _LIGER["problem"] = None, str(e)
    return _LIGER["problem"]


def seat_repos() -> list[FakeRepo]:
    from tests.support.liger_fixture import liger_repo

    extra = [] if liger_problem() else [liger_repo(_LIGER["source"])]
    return extra + [
        _repo("seat-rmsnorm", ["torch-universal"]),
        # torch-universal too, so that seat-experts' dependency on it resolves on a GPU host.
        _repo("seat-activation", ["torch-cpu", "torch-universal"]),
        _repo("seat-linear", ["torch-cpu", "torch-universal"], versions=(1, 2)),
        _repo("seat-experts", ["torch-universal"], depends=[{"repo-id": ACTIVATION, "version": 1}]),
        _repo("seat-wrong", ["torch-universal"]),
        _repo("seat-triton", ["torch-cuda"]),
        _repo("seat-triton-sm80", ["torch-cuda"], source="seat-triton", archs=["8.0"]),
    ]


def write_stage_manifest(path: Path, target: str, repos: tuple[str, ...] = STAGED) -> Path:
    lines = [f'[[targets]]\ntarget = "{target}"\n', "[kernels]"]
    lines += [f'"{r}" = {{ version = 1 }}' for r in repos]
    path.write_text("\n".join(lines) + "\n")
    return path


# --- a staged home and tiny models, shared by the seat tests and bench/seats.py ----------------------

_STAGED: dict[str, Path] = {}


def staged_home(root: Path) -> Path:
    """Stage the seat fixtures for this host once per process, with the real `frt-mirror stage` CLI,
    from a fake Hub that is stopped afterwards: attach then has nothing to reach but the home."""
    if "home" not in _STAGED:
        from frt.resolver.targets import host_target
        from tests.support.cli import run_cli_process
        from tests.support.fakehub import FakeHub

        home = root / "home"
        with FakeHub(seat_repos(), trusted_orgs=[ORG]) as hub:
            target = host_target()
            cuda = target.backend.startswith("cu")
            repos = STAGED + (STAGED_CUDA if cuda else ()) + ((LIGER,) if cuda and not liger_problem() else ())
            manifest = write_stage_manifest(root / "seats-manifest.toml", str(target), repos)
            # A process: bench/seats.py stages here too, outside pytest (whose conftest gives this
            # process the environment a command run in it needs: tests/support/cli.py).
            p = run_cli_process("--endpoint", hub.url, "stage", str(manifest), home=home)
        if p.returncode != 0:
            raise RuntimeError(f"staging the seat fixtures failed:\n{p.stdout}\n{p.stderr}")
        _STAGED["home"] = home
    return _STAGED["home"]


def randomize(model):
    """Random weights everywhere, norms included (their init is all ones, under which a kernel that
    forgot the weight would still pass parity)."""
    import torch

    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32).to(p.dtype)
            p.copy_(1 + 0.1 * noise if p.dim() == 1 and "norm" in name else 0.05 * noise)
    return model.eval()


# The tiny shape both Qwen3s share.
_TINY_QWEN3 = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    tie_word_embeddings=False,
)


def tiny_qwen3(**overrides):
    """A dense Qwen3 from a tiny config (attention with a bias, so bias handling is exercised)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = {**_TINY_QWEN3, "attention_bias": True}
    return randomize(Qwen3ForCausalLM(Qwen3Config(**{**cfg, **overrides})))


def tiny_qwen3_moe(**overrides):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    moe = dict(moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True)
    cfg = {**_TINY_QWEN3, **moe}
    return randomize(Qwen3MoeForCausalLM(Qwen3MoeConfig(**{**cfg, **overrides})))


# --- what the seat tests compare -------------------------------------------------------------------


def logits(model, ids):
    import torch

    with torch.no_grad():
        return model(ids).logits


def generate(model, ids, n=5):
    import torch

    with torch.no_grad():
        return model.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=0)


def rel(a, b) -> float:
    """Relative L2 error of ``a`` against ``b``, in float64."""
    return float((a.double() - b.double()).norm() / b.double().norm())


class Baseline:
    """A model before anything is attached: its modules, its logits on `ids` and its greedy tokens (`n`
    new), taken at construction. Detach must give back exactly this."""

    def __init__(self, model, ids, n: int = 5):
        self.model, self.ids, self.n = model, ids, n
        self.modules = dict(model.named_modules())
        self.logits, self.tokens = logits(model, ids), generate(model, ids, n)

    def assert_restored(self) -> None:
        """Every module is the original object again; logits and tokens are bit-identical to before."""
        import torch

        assert all(m is self.modules[n] for n, m in self.model.named_modules())
        assert torch.equal(logits(self.model, self.ids), self.logits)
        assert torch.equal(generate(self.model, self.ids, self.n), self.tokens)


def seats_in(model) -> list[str]:
    """The names of the model's modules that are seats now."""
    from frt.seats import Seat

    return [n for n, m in model.named_modules() if isinstance(m, Seat)]


def attach_within(model, ids, catalog, home: Path, *, seats: int, bound: float):
    """Attach `catalog` from `home`: all `seats` seated, none refused, logits on `ids` within `bound`
    (relative) of the unseated model's; then detach, and they are bit-identical again. The detached handle."""
    import torch

    from frt.seats import attach

    base = logits(model, ids)
    handle = attach(model, catalog, home=home)
    assert handle.notes["refused"] == [] and len(handle.records) == seats
    assert rel(logits(model, ids), base) < bound
    handle.detach()
    assert torch.equal(logits(model, ids), base)
    return handle
