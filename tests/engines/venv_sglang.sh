#!/usr/bin/env bash
# Create (or reuse) the virtual environment the SGLang engine tests run in, and print its python.
#
# It holds the real sglang==0.5.23 (a cp311 wheel), installed --no-deps: its full pins (flashinfer,
# sglang-kernel, nvshmem, …) are GPU runtimes that neither install usefully nor run on a CPU box. Beside
# it, only what `import sglang.srt.plugins, sglang.srt.model_executor.model_runner` needs, at SGLang's
# own pins where it has them. torch is SGLang's 2.14.1: torch 2.13.0+cpu imports sglang's core, but
# model_runner imports torchvision, and PyPI's torchvision builds link against the CUDA torch (for 2.13
# that would mean a CUDA 2.13 download; 2.14.1 and its libraries come from this machine's disk).
#
# Cached under ${FRT_ENV_CACHE:-$HOME/.cache/frt-mirror/envs}, keyed by python's version, the pins below,
# frt-mirror's own dependencies (pyproject.toml) and this script's text. frt itself is NOT installed: the
# tests put it on PYTHONPATH the way a read-only cluster mount does (`frt-mirror env --engine sglang`),
# so the cached venv never points into one checkout.
#
#   bash tests/engines/venv_sglang.sh            # prints .../sglang-<hash>/bin/python
set -euo pipefail
shopt -s inherit_errexit 2>/dev/null || true
root="$(cd "$(dirname "$0")/../.." && pwd)"
py="${PYTHON:-$(command -v python3.11 || command -v python3)}"
if [ "$("$py" -c 'import sys; print(sys.version_info[:2] == (3, 11))')" != True ]; then
  echo "venv_sglang: sglang 0.5.23 ships a cp311 wheel only; $py is not Python 3.11 (set PYTHON=python3.11)" >&2
  exit 2
fi

SGLANG="sglang==0.5.23"
# What sglang's model_runner imports on CPU, found by importing it until nothing was missing; the
# == pins are sglang 0.5.23's own. triton and the nvidia libraries come with torch 2.14.1.
pins="torch==2.14.1
torchvision==0.29.1
transformers==5.19.0
tokenizers==0.23.2
apache-tvm-ffi==0.1.11
compressed-tensors==0.18.0
openai==2.8.0
sentencepiece==0.2.1
aiohttp
dill
einops
fastapi
gguf
ipython
msgspec
numpy
orjson
partial_json_parser
pillow
psutil
pybase64
pydantic
pyzmq
requests
tqdm
uvicorn
pytest>=8"
# frt-mirror's runtime dependencies, read from pyproject.toml.
. "$root/tests/engines/cached_venv.sh"
reqs="$(printf '%s\n%s\n' "$pins" "$(frt_deps "$py")" | LC_ALL=C sort)"
if venv_open sglang "$("$py" -c 'import sys; print(sys.version_info[:3])')
$SGLANG
$reqs"; then
  printf '%s\n' "$reqs" > "$venv/requirements.txt"
  "$venv/bin/python" -m pip install -q --no-deps "$SGLANG" 2>&1 | quiet_pip
  "$venv/bin/python" -m pip install -q -r "$venv/requirements.txt" 2>&1 | quiet_pip
  # The import is the contract: a venv that cannot import the classes the tests hook is not cached.
  if ! err="$(PYTHONWARNINGS=ignore "$venv/bin/python" -c \
    "import sglang.srt.plugins.hook_registry, sglang.srt.model_executor.model_runner as m; m.ModelRunner.load_model" 2>&1)"
  then
    echo "venv_sglang: $venv cannot import sglang's ModelRunner: $(tail -n 1 <<<"$err")" >&2
    exit 1
  fi
  touch "$venv/.complete"
fi
echo "$venv/bin/python"
