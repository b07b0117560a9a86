#!/usr/bin/env bash
# The checks that need a CUDA GPU, in parts (PARTS). With no arguments it
# runs GPU decode's verification, setup included, within 600 s (the sum of
# its steps' timeouts, which tests/test_gpu_check.py holds under that):
#
#   preflight    fastq's nvImageCodec backend opens and decodes a probe box
#                (benchmarks/gpu_preflight.py: `python -m fastq doctor
#                --json` where fastq has it); the run stops here if not
#   engine       the engines on their own, 2,048 bench files in batches of
#                128 (benchmarks/decode_engine.py): hardware only with and
#                without boxes, hybrid splits, the adaptive policy, two
#                Decoders in turn, torchvision's batched decode_jpeg; images/s,
#                CPU per image of the calling thread and of the process,
#                nvidia-smi dmon's jpg%
#   pixels       512 decoded boxes against Pillow's crops: shape, mean,
#                border and largest difference (benchmarks/decode_box_pixels.py)
#   stage        the decode stage's host time per image
#                (benchmarks/decode_stage_host.py, where it is there)
#   resnet18     the training bench, ResNet-18: DataLoader, the nvImageCodec
#                and torchvision GPU-decode rows and the ceiling, 60 steps
#                after 10, with the first batch
#
# Then a summary of each target with its measured figure and pass/fail
# (benchmarks/gpu_summary.py). Behind PARTS, each under 600 s alone:
#
#   tests        the CUDA tests, the start-up bench with CUDA initialised
#                first, page-locking a ring whole against slot by slot
#   first-batch  the first batch, three runs each: DataLoader, the pinned
#                drop-in and the GPU-decode loader with each backend
#   train-all    the training bench: ResNet-18 and ResNet-50, every loader
#   model        the GPU-timeline model's case (it runs on the CPU alone)
#
#     OUT=benchmarks/results/gpu-check bash benchmarks/gpu_check.sh
#     PARTS="tests model" bash benchmarks/gpu_check.sh
#     GPU_CHECK_DRY=1 bash benchmarks/gpu_check.sh   # the plan, nothing run
#
# GPU_CHECK_KEEP_GOING=1 runs the parts after a failed preflight anyway.
# Runs on the machine's own CUDA builds of torch and torchvision and
# fetches nothing: nvImageCodec and the nvJPEG library it loads are
# installed from benchmarks/wheels/ (benchmarks/fetch_gpu_wheels.sh, about
# 29 MB, carried with the checkout). fastq's extension is built in place if
# it is not there: with Cython where the machine has it, else from the C
# files Cython made beforehand (src_c/_*.c, 4.5 MB: run `python setup.py
# build_ext --inplace` on the machine that sends the checkout, and carry
# them too). Writes each output under $OUT (default benchmarks/results/gpu-check),
# named for the GPU, and steps-GPU.txt: each step's exit status and time.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-benchmarks/results/gpu-check}"
parts="${PARTS:-preflight engine pixels stage resnet18}"
dry="${GPU_CHECK_DRY:-0}"
# The machine's Python: GPU images often have python3 alone.
py="${PYTHON:-$(command -v python3 || command -v python)}"
known=" preflight engine pixels stage resnet18 tests first-batch train-all model "
for part in $parts; do
    case "$known" in
    *" $part "*) ;;
    *)
        echo "PARTS: unknown part $part (preflight, engine, pixels, stage, resnet18;" \
            "tests, first-batch, train-all, model)" >&2
        exit 2
        ;;
    esac
done
planned=0
if [ "$dry" = 1 ]; then
    gpu="GPU"
    echo "plan (GPU_CHECK_DRY=1): PARTS=\"$parts\", outputs under $out"
    printf 'step %-16s %4d s  %s\n' gpu-name 10 "nvidia-smi --query-gpu=name"
    planned=10
else
    mkdir -p "$out"
    gpu="$(timeout 10 nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '-')"
    gpu="${gpu:-no-GPU}"
    : > "$out/steps-$gpu.txt"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
cpus="$(nproc 2>/dev/null || echo 1)"
failed=""

# step NAME SECONDS LOG COMMAND...: COMMAND under `timeout SECONDS` (its
# process group: children included), its output into LOG. A dry run prints
# the line instead; the test sums those.
step() {
    local name="$1" seconds="$2" log="$3"
    shift 3
    if [ "$dry" = 1 ]; then
        local cmd
        cmd="$(printf '%s ' "$@" | tr -s ' \n' '  ')"
        printf 'step %-16s %4d s  %s\n' "$name" "$seconds" "${cmd:0:110}"
        planned=$((planned + seconds))
        return 0
    fi
    local t0=$SECONDS rc
    timeout "$seconds" "$@" > "$log" 2>&1
    rc=$?
    printf '%-16s rc=%-3d %4d s of %4d s  %s\n' "$name" "$rc" "$((SECONDS - t0))" \
        "$seconds" "$log" | tee -a "$out/steps-$gpu.txt"
    [ "$rc" = 0 ] || failed="$failed $name"
    return "$rc"
}

# ------------------------------------------------------------------ setup
step machine 10 "$out/machine-$gpu.txt" bash -c \
    'nvidia-smi; lscpu | grep -E "Model name|^CPU\(s\)"'
# With Cython where it is there; else setuptools compiles the carried C
# files (it takes them for the .pyx sources where Cython.Distutils does not
# import: a Cython with cythonize() alone, which hands the modules back).
step build 75 "$out/build-$gpu.txt" bash -c '
    if "$0" -c "import fastq._core._ring, fastq._workers._records" 2>/dev/null; then
        echo "fastq extension already built"
    elif "$0" -c "import Cython" 2>/dev/null; then
        "$0" setup.py build_ext --inplace -q -j "$1"
    elif [ -f src_c/_ring.c ]; then
        stub="$(mktemp -d)"; mkdir "$stub/Cython"; : > "$stub/Cython/__init__.py"
        printf "def cythonize(module_list, **_):\n    return module_list\n" > "$stub/Cython/Build.py"
        PYTHONPATH="$stub:$PYTHONPATH" "$0" setup.py build_ext --inplace -q -j "$1"
    else
        echo "no Cython and no src_c/_*.c: carry the C files Cython made" >&2; exit 1
    fi' "$py" "$cpus"
step wheels 40 "$out/wheels-$gpu.txt" bash -c '
    if ! ls benchmarks/wheels/*.whl >/dev/null 2>&1; then
        echo "no benchmarks/wheels/: run benchmarks/fetch_gpu_wheels.sh and carry it" >&2
        exit 1
    fi
    # The machine is lent bare and given back bare: its own Python takes
    # them (an externally managed one with the override).
    "$0" -m pip install --quiet --no-index --no-deps benchmarks/wheels/*.whl \
        || "$0" -m pip install --quiet --no-index --no-deps --break-system-packages \
            benchmarks/wheels/*.whl' "$py"
# nvImageCodec's nvJPEG extension loads libnvjpeg.so.13 from the CUDA 13
# wheels' library folder (nvidia/cu13/lib, where nvidia-nvjpeg puts it).
if [ "$dry" = 1 ]; then
    printf 'step %-16s %4d s  %s\n' cu13-lib 10 "the folder of libnvjpeg.so.13"
    planned=$((planned + 10))
else
    cu13="$(timeout 10 "$py" -c "import nvidia, os; print(next((os.path.join(p, 'cu13', 'lib') for p in nvidia.__path__ if os.path.isdir(os.path.join(p, 'cu13', 'lib'))), ''))" 2>/dev/null)"
    if [ -n "$cu13" ]; then
        export LD_LIBRARY_PATH="$cu13${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
fi
step versions 25 "$out/versions-$gpu.txt" "$py" -c '
import importlib.metadata as md, sys
import torch, torchvision, fastq._core._ring
print("python", sys.version.split()[0])
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())
print("torchvision", torchvision.__version__)
for name in ("nvidia-nvimgcodec-cu13", "nvidia-nvjpeg"):
    print(name, md.version(name))
print("fastq ready")'
if [ "$dry" != 1 ] && ! grep -q "fastq ready" "$out/versions-$gpu.txt"; then
    cat "$out/build-$gpu.txt" "$out/wheels-$gpu.txt" "$out/versions-$gpu.txt"
    exit 1
fi
# The training bench's files, made once: one epoch of the ResNet-18 run
# (70 steps of 128); the engine's and the pixels' 2,048 are the first.
step files 40 "$out/files-$gpu.txt" "$py" -c '
import time
from fastq._bench.train_data import default_dir, make_files
t = time.perf_counter()
print(len(make_files(default_dir(), 70 * 128, 224)), "files", round(time.perf_counter() - t, 1), "s")'

# ------------------------------------------------------------------ parts
for part in $parts; do
    case "$part" in
    preflight)
        if ! step preflight 20 "$out/preflight-$gpu.txt" "$py" benchmarks/gpu_preflight.py \
            && [ "${GPU_CHECK_KEEP_GOING:-0}" != 1 ]; then
            cat "$out/preflight-$gpu.txt"
            echo "the nvImageCodec backend does not open: stopped (GPU_CHECK_KEEP_GOING=1 goes on)"
            exit 1
        fi
        ;;
    engine)
        step engine 95 "$out/engine-$gpu.txt" "$py" benchmarks/decode_engine.py \
            --files 2048 --batch 128 --seconds 3 --json "$out/engine-$gpu.json"
        ;;
    pixels)
        step pixels 40 "$out/pixels-$gpu.txt" "$py" benchmarks/decode_box_pixels.py \
            --samples 512 --json "$out/pixels-$gpu.json"
        ;;
    stage)
        if [ -f benchmarks/decode_stage_host.py ] || [ "$dry" = 1 ]; then
            step stage 40 "$out/stage-host-$gpu.txt" bash -c '
                if [ ! -f benchmarks/decode_stage_host.py ]; then
                    echo "skipped: benchmarks/decode_stage_host.py is not in this checkout"; exit 0
                fi
                help="$("$0" benchmarks/decode_stage_host.py --help 2>&1)"
                args=()
                case "$help" in *--device*) args+=(--device cuda) ;; esac
                case "$help" in *--json*) args+=(--json "$1") ;; esac
                exec "$0" benchmarks/decode_stage_host.py "${args[@]}"' \
                "$py" "$out/stage-host-$gpu.json"
        else
            echo "skipped: benchmarks/decode_stage_host.py is not in this checkout" \
                | tee "$out/stage-host-$gpu.txt"
        fi
        ;;
    resnet18)
        step resnet18 150 "$out/resnet18-$gpu.txt" "$py" -m fastq bench --case train \
            --workers $((cpus - 1)) --model resnet18 --steps 60 --warmup-steps 10 \
            --loader "DataLoader,GPU decode: nvImageCodec,GPU decode: torchvision,ceiling" \
            --json "$out/resnet18-$gpu.json"
        ;;
    tests)
        step cuda-tests 150 "$out/cuda-tests-$gpu.txt" "$py" -m pytest -q -o addopts= \
            -p no:cacheprovider tests/test_torch_cuda.py tests/test_dataloader_pinned.py \
            tests/test_pinned_registration.py $(ls tests/test_decode*.py 2>/dev/null)
        step torch-startup 80 "$out/torch-startup-$gpu.txt" "$py" -m fastq bench \
            --case torch-startup --repeat 2 --workers 2
        step pin-register 60 "$out/pin-register-$gpu.txt" "$py" benchmarks/pin_register.py \
            --gib 1
        ;;
    first-batch)
        step first-batch 150 "$out/first-batch-$gpu.txt" "$py" -m fastq bench --case train \
            --workers $((cpus - 1)) --model resnet18 --steps 5 --warmup-steps 1 --repeat 3 \
            --loader "DataLoader,fastq.torch.DataLoader,GPU decode: nvImageCodec,GPU decode: torchvision"
        ;;
    train-all)
        step train-all 360 "$out/train-$gpu.txt" "$py" -m fastq bench --case train \
            --workers $((cpus - 1)) --json "$out/train-$gpu.json"
        ;;
    model)
        step model 200 "$out/gpu-model-$gpu.txt" "$py" -m fastq bench --case gpu-model
        ;;
    esac
done

step summary 15 "$out/summary-$gpu.log" "$py" benchmarks/gpu_summary.py "$out" "$gpu"
if [ "$dry" = 1 ]; then
    echo "total $planned s of timeouts"
    exit 0
fi
cat "$out/summary-$gpu.txt" 2>/dev/null || cat "$out/summary-$gpu.log"
if [ -n "$failed" ]; then
    echo "failed or timed out:$failed (each step's log under $out)"
    exit 1
fi
