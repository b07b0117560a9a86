#!/usr/bin/env bash
# The checks that need a CUDA GPU, in parts (PARTS, default all of them):
#
#   tests        the CUDA tests (the pinned ring of both faces, copies on a
#                side stream, slots held until their copies have run,
#                workers forked after CUDA with a late import, the decode
#                stage's tests/test_decode*.py on the GPU), the start-up
#                bench with CUDA initialised first, and page-locking a ring
#                whole against slot by slot (benchmarks/pin_register.py)
#   first-batch  the first batch, three runs each: DataLoader, the pinned
#                drop-in and the GPU-decode loader with each backend
#                (ResNet-18, 15 workers, pin_memory=True)
#   train        the training bench: ResNet-18 input-bound and ResNet-50
#                GPU-bound, every loader (the GPU-decode rows with
#                nvImageCodec and torchvision's decode_jpeg included) beside
#                the batch-reused ceiling
#   model        the GPU-timeline model's case on the same machine, so that
#                the model's figures can be set beside the GPU's
#
# Every part has its timeouts, 19 minutes together at most; where a command
# may run 10 minutes at most, run PARTS=tests (5 minutes at most),
# PARTS="first-batch model" (6) and PARTS=train (8) apart. The first run on
# a machine also makes the bench's JPEG files (about 20 s on 16 vCPUs).
#
# Runs on whatever CUDA build of torch and torchvision the machine has (it
# fetches nothing): it prints their versions. nvImageCodec and the nvJPEG
# library it loads are installed from benchmarks/wheels/ (made by
# benchmarks/fetch_gpu_wheels.sh and carried with the checkout); without
# them the nvImageCodec rows say "not available". fastq's extension is
# built in place if it is not there yet (needs Cython and a compiler);
# where the machine has no Cython, build it beforehand for the machine's
# Python (python3.X setup.py build_ext --inplace) and carry the
# fastq/_*/*.so files. Writes each output under $OUT (default:
# benchmarks/results/gpu-run), named for the machine. Each step has a
# timeout.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-benchmarks/results/gpu-run}"
parts="${PARTS:-tests first-batch train model}"
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
    if ls benchmarks/wheels/*.whl >/dev/null 2>&1; then
        # The machine is lent bare and given back bare: its own Python
        # takes them (an externally managed one with the override).
        "$py" -m pip install --quiet --no-index --no-deps benchmarks/wheels/*.whl \
            || "$py" -m pip install --quiet --no-index --no-deps \
                --break-system-packages benchmarks/wheels/*.whl
    else
        echo "no benchmarks/wheels/: the nvImageCodec rows are not available"
    fi
    "$py" -c "import nvidia.nvimgcodec as n; print('nvImageCodec', n.__version__)"
    "$py" -c "import fastq._core._ring, numpy, cloudpickle, pytest; print('fastq ready')"
} > "$out/machine-$gpu.txt" 2>&1
if ! grep -q "fastq ready" "$out/machine-$gpu.txt"; then
    cat "$out/machine-$gpu.txt"
    exit 1
fi
# nvImageCodec's nvJPEG extension loads libnvjpeg.so.13 from the CUDA 13
# wheels' library folder (nvidia/cu13/lib, where nvidia-nvjpeg puts it).
cu13="$("$py" -c "import nvidia, os; print(next((os.path.join(p, 'cu13', 'lib') for p in nvidia.__path__ if os.path.isdir(os.path.join(p, 'cu13', 'lib'))), ''))" 2>/dev/null)"
if [ -n "$cu13" ]; then
    export LD_LIBRARY_PATH="$cu13${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

for part in $parts; do
    case "$part" in
    tests)
        timeout 150 "$py" -m pytest -q -o addopts= -p no:cacheprovider \
            tests/test_torch_cuda.py tests/test_dataloader_pinned.py \
            tests/test_pinned_registration.py $(ls tests/test_decode*.py 2>/dev/null) \
            > "$out/cuda-tests-$gpu.txt" 2>&1
        timeout 80 "$py" -m fastq bench --case torch-startup --repeat 2 --workers 2 \
            > "$out/torch-startup-$gpu.txt" 2>&1
        timeout 60 "$py" benchmarks/pin_register.py --gib 1 \
            > "$out/pin-register-$gpu.txt" 2>&1
        ;;
    first-batch)
        timeout 150 "$py" -m fastq bench --case train --workers 15 --model resnet18 \
            --steps 5 --warmup-steps 1 --repeat 3 \
            --loader "DataLoader,fastq.torch.DataLoader,GPU decode: nvImageCodec,GPU decode: torchvision" \
            > "$out/first-batch-$gpu.txt" 2>&1
        ;;
    train)
        timeout 450 "$py" -m fastq bench --case train --workers 15 \
            > "$out/train-$gpu.txt" 2>&1
        ;;
    model)
        timeout 200 "$py" -m fastq bench --case gpu-model \
            > "$out/gpu-model-$gpu.txt" 2>&1
        ;;
    *)
        echo "PARTS: unknown part $part (tests, first-batch, train, model)" >&2
        exit 2
        ;;
    esac
done
tail -n 3 "$out"/*.txt
