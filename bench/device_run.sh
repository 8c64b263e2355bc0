#!/bin/bash
# bench/device_run.sh [all|tests|bench|smoke]: issue #18's run on the GPU machine, in one command.
#
#   device run, carry ["device-wheels"]:  bash bench/device_run.sh
#
# The machine has torch 2.11 + CUDA 13.0, Triton 3.6, transformers 5.17 and huggingface_hub 1.33 but
# no network and no kernels library: device-wheels/ (bash bench/device_wheels.sh, on a connected box)
# brings kernels 0.17.2 and its tree, what frt-mirror needs beyond the image, setuptools for the
# editable build, and liger-kernel 0.8.5. Then: the GPU tests, then the benchmark; a failing test does
# not stop the benchmark. Everything is logged under $OUT (install.log, pytest.log, bench.log,
# bench.json); the exit status is the first failing step's.
#   all    install, tests (at most 150 s), bench (at most $BENCH_S, default 400 s): the default, inside one
#          600 s device call (on the H200: ~60 s install, ~55 s tests, ~300 s bench)
#   tests  install, tests          bench  install, bench          smoke  install, tests, bench --quick
set -x
cd "$(dirname "$0")/.." || exit 2
what=${1:-all}
OUT=${OUT:-/tmp/frt-device-out}
mkdir -p "$OUT"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 HF_HUB_DISABLE_XET=1 PIP_DISABLE_PIP_VERSION_CHECK=1
status=0
note() { [ "$status" -ne 0 ] || status=$1; }

{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  "$py" -c 'import sys, torch, triton, transformers, huggingface_hub as h; print(sys.version.split()[0], "torch",
    torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available(), "triton", triton.__version__,
    "transformers", transformers.__version__, "huggingface_hub", h.__version__)'
  ls device-wheels | wc -l
  # Resolved against what the image has; if pip cannot resolve it offline, every wheel as it is.
  "$py" -m pip install --no-index --find-links device-wheels kernels==0.17.2 'SQLAlchemy>=2,<3' 'starlette>=0.40' \
      'uvicorn>=0.30' 'click>=8.1' 'filelock>=3.12' 'packaging>=23' \
    || "$py" -m pip install --no-index --no-deps $(ls device-wheels/*.whl | grep -v -e liger_kernel -e setuptools)
  # liger-kernel's requirements are torch and triton: the image's, so none are resolved.
  "$py" -m pip install --no-index --no-deps device-wheels/liger_kernel-0.8.5-py3-none-any.whl
  # The editable build is isolated, with setuptools from device-wheels (the image's may be older than 77).
  "$py" -m pip install --no-index --find-links device-wheels --no-deps -e .
  "$py" -m pip check
  "$py" -c 'import frt.seats, kernels, liger_kernel; from importlib.metadata import version as v
print("frt-mirror", v("frt-mirror"), "kernels", v("kernels"), "liger-kernel", v("liger-kernel"))'
} 2>&1 | tee "$OUT/install.log"
"$py" -c 'import frt.seats, kernels' || { echo "install failed: see $OUT/install.log"; exit 3; }

if [ "$what" = all ] || [ "$what" = tests ] || [ "$what" = smoke ]; then
  set -o pipefail
  timeout 150 "$py" -m pytest -v -rs --durations=8 tests/test_seats_gpu.py 2>&1 | tee "$OUT/pytest.log"
  note $?
  set +o pipefail
fi
if [ "$what" = all ] || [ "$what" = bench ] || [ "$what" = smoke ]; then
  quick=()
  [ "$what" = smoke ] && quick=(--quick)
  set -o pipefail
  timeout "${BENCH_S:-400}" "$py" -m bench.seats --device cuda "${quick[@]}" --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
  note $?
  set +o pipefail
fi
exit "$status"
