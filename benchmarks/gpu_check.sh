#!/usr/bin/env bash
# The checks that need a CUDA GPU, as one run (about 7 minutes on an H100
# with 16 cores): the CUDA tests (the pinned ring of both faces, copies on a
# side stream, slots held until their copies have run, workers forked after
# CUDA with a late import), the start-up bench with CUDA initialised first,
# the training bench (ResNet-18 input-bound and ResNet-50 GPU-bound, every
# loader beside the batch-reused ceiling, pin_memory=True), then the
# GPU-timeline model's case on the same machine, so that the model's
# figures can be set beside the GPU's.
#
# Runs on whatever CUDA build of torch and torchvision the machine has (it
# fetches nothing): it prints their versions. fastq's extension is built in
# place if it is not there yet (needs Cython and a compiler); where the
# machine has no Cython, build it beforehand for the machine's Python
# (python3.X setup.py build_ext --inplace) and carry the fastq/_*/*.so files.
# Writes each output under $OUT (default: benchmarks/results/gpu-run),
# named for the machine. Each step after the build has a timeout, together
# 550 s at most: under the device machine's 10 minutes a command.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-benchmarks/results/gpu-run}"
mkdir -p "$out"
gpu="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '-')"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# The machine's Python: GPU images often have python3 alone.
py="${PYTHON:-$(command -v python3 || command -v python)}"
{
    nvidia-smi
    lscpu | grep -E "Model name|^CPU\(s\)"
    "$py" -c "import sys; print('python', sys.version.split()[0])"
    "$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
    "$py" -c "import torchvision; print('torchvision', torchvision.__version__)"
    if ! "$py" -c "import fastq._core._ring" 2>/dev/null; then
        echo "building fastq's extension in place"
        "$py" setup.py build_ext --inplace -q -j "$(nproc)" || exit 1
    fi
    "$py" -c "import fastq._core._ring, numpy, cloudpickle, pytest; print('fastq ready')"
} > "$out/machine-$gpu.txt" 2>&1
if ! grep -q "fastq ready" "$out/machine-$gpu.txt"; then
    cat "$out/machine-$gpu.txt"
    exit 1
fi

timeout 150 "$py" -m pytest -q -o addopts= -p no:cacheprovider tests/test_torch_cuda.py tests/test_dataloader_pinned.py \
    > "$out/cuda-tests-$gpu.txt" 2>&1
timeout 80 "$py" -m fastq bench --case torch-startup --repeat 2 --workers 2 > "$out/torch-startup-$gpu.txt" 2>&1
timeout 240 "$py" -m fastq bench --case train --workers 15 > "$out/train-$gpu.txt" 2>&1
timeout 80 "$py" -m fastq bench --case gpu-model > "$out/gpu-model-$gpu.txt" 2>&1
tail -n 3 "$out"/*.txt
