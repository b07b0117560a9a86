#!/usr/bin/env bash
# Fetches the GPU decode backend's wheels into benchmarks/wheels/ (ignored by
# git), for a GPU machine that can fetch nothing: benchmarks/gpu_check.sh
# installs them from there. nvImageCodec 0.9 for CUDA 13, and the nvJPEG
# library its nvJPEG extension loads (torch's CUDA 13 wheels do not bring
# it): 13.2, since nvImageCodec 0.9 documents region decode with fancy
# upsampling as wrong at the image's edge with nvJPEG older than 13.2. For
# Python 3.12 on manylinux x86_64, the GPU machine's. About 29 MB together;
# the device machine carries at most 64 MB of ignored files with the
# checkout, so this fails above MAX_MB (60).
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
    "nvidia-nvimgcodec-cu13==0.9.0.20" "nvidia-nvjpeg==13.2.3.58"
du -ch wheels/*.whl
max_mb="${MAX_MB:-60}"
bytes="$(cat wheels/*.whl | wc -c)"
if [ "$bytes" -gt $((max_mb * 1000 * 1000)) ]; then
    echo "benchmarks/wheels/ holds $((bytes / 1000000)) MB, over $max_mb MB: remove" \
        "wheels of other pins (ls benchmarks/wheels)" >&2
    exit 1
fi
