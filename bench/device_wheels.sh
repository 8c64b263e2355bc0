#!/bin/bash
# bench/device_wheels.sh [DIR]: the wheels bench/device_run.sh installs on the GPU machine, which has
# no network. DIR defaults to device-wheels/ in the repo root (git-ignored; name it in the device
# call's `carry`). Run it on a connected box with pip; it downloads one pinned wheel per package,
# --no-deps, for CPython 3.12 on manylinux x86_64 (glibc 2.28 builds at the newest, so that an older
# image than the one seen still takes them).
#
# What the GPU machine already has is not here: torch 2.11 + CUDA 13.0, Triton 3.6, transformers
# 5.17, huggingface_hub 1.33 (transformers there needs huggingface_hub < 2), httpx, requests, rich,
# pyyaml, packaging, click, filelock, anyio, h11, urllib3, idna, typing... (its image's list is in the
# device notes). Here: kernels 0.17.2 and what it needs beyond those (sigstore and its tree, tomlkit),
# what frt-mirror needs beyond those (SQLAlchemy, starlette, uvicorn; click, filelock and packaging
# too, in case the image's are older than ours), setuptools for the editable install's build
# (pip builds it isolated, from this folder), and liger-kernel 0.8.5, whose wheel the Liger fixture
# kernel (tests/support/liger_fixture.py) copies its sources from.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-device-wheels}
py=${PYTHON:-python3}
mkdir -p "$dir"
pins=(
  kernels==0.17.2 tomlkit==0.15.2
  sigstore==4.5.1 sigstore-models==0.0.6 sigstore-rekor-types==0.0.18 tuf==7.0.1 securesystemslib==1.6.0
  rfc3161-client==1.0.9 rfc8785==0.1.4 id==1.6.1 pyjwt==2.15.1 platformdirs==4.14.9
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  typing-extensions==4.16.0 email-validator==2.4.0 dnspython==2.9.2
  cryptography==50.0.2 cffi==2.1.1 pycparser==3.12
  SQLAlchemy==2.1.9 starlette==1.10.0 uvicorn==0.54.0 click==8.5.1 filelock==4.3.1 packaging==26.4
  setuptools==84.2.1
  liger-kernel==0.8.5
)
platforms=()
for p in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 \
         manylinux1; do
  platforms+=(--platform "${p}_x86_64")
done
for pin in "${pins[@]}"; do
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d "$dir" "$pin"
done
ls "$dir" | wc -l
du -sh "$dir"
