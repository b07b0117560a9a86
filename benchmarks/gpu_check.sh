#!/usr/bin/env bash
# The checks that need a CUDA GPU, as one run: the CUDA tests (the pinned
# ring of both faces, copies on a side stream, slots held until their
# copies have run, workers forked after CUDA with a late import), the
# start-up bench with CUDA initialised first, and the training bench
# (ResNet-18 input-bound and ResNet-50 GPU-bound, every loader beside the
# batch-reused ceiling). Needs a CUDA build of torch==2.13.0 and
# torchvision==0.28.0 in the environment, and fastq built in place
# (python setup.py build_ext --inplace). Writes each output under $OUT
# (default: benchmarks/results/gpu-run), named for the machine.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-benchmarks/results/gpu-run}"
mkdir -p "$out"
gpu="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '-')"
{
    nvidia-smi
    lscpu | grep -E "Model name|^CPU\(s\)"
    python -c "import torch; print('torch', torch.__version__, torch.version.cuda)"
} > "$out/machine-$gpu.txt" 2>&1

python -m pytest -q -p no:cacheprovider tests/test_torch_cuda.py tests/test_dataloader_pinned.py \
    > "$out/cuda-tests-$gpu.txt" 2>&1
python -m fastq bench --case torch-startup > "$out/torch-startup-$gpu.txt" 2>&1
python -m fastq bench --case train > "$out/train-$gpu.txt" 2>&1
tail -n 3 "$out"/*.txt
