#!/usr/bin/env bash
# Fetches the GPU decode backend's wheels into benchmarks/wheels/ (ignored by
# git), for a GPU machine that can fetch nothing: benchmarks/gpu_check.sh
# installs them from there. nvImageCodec for CUDA 13 (its nvJPEG extension
# loads libnvjpeg, which torch's CUDA 13 wheels do not bring: nvidia-nvjpeg
# of CUDA 13.0, as torch 2.11's cu130 build), for Python 3.12 on manylinux
# x86_64, the GPU machine's. About 29 MB together; the device machine
# carries at most 64 MB of ignored files with the checkout.
#
#     bash benchmarks/fetch_gpu_wheels.sh    # PYTHON=python3.X to choose pip's
set -euo pipefail
cd "$(dirname "$0")"
py="${PYTHON:-$(command -v python3 || command -v python)}"
mkdir -p wheels
"$py" -m pip download --quiet --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --abi cp312 --abi none \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
    --dest wheels \
    "nvidia-nvimgcodec-cu13==0.9.0.20" "nvidia-nvjpeg==13.0.4.44"
du -ch wheels/*.whl
