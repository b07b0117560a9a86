"""What the GPU-timeline model (fastq/_bench/gpu_timeline.py) is given: the
H200's measured figures it is checked against, the measured costs it is
built from, and the assumptions that no machine has measured yet, each
with where it comes from.

Three kinds of number, kept apart:

- MEASURED ON THE H200 (benchmarks/results/gpu-run*, `python -m fastq
  bench --case train --workers 15` on one H200 with a 16-vCPU Xeon host):
  the step's GPU time and its loop thread's CPU, and the input-bound
  loaders' images/s. The model takes the first two as inputs and only
  checks itself against the third.
- MEASURED ON A CPU: the workers' CPU per image of the train bench's
  pipeline (its "workers' CPU us/image" column), the worker's cost of an
  encoded sample, the set's files, and the stage's host time per image.
- ASSUMED: the JPEG engines' rate (two rows: 7,000 and 10,900 images/s of
  the bench's files), the decode call's submit time, the stage's kernels
  on the SMs. `benchmarks/gpu_check.sh` measures each on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from . import gpu_model

# ------------------------------------------------- measured on the H200

# Images/s of the ceiling (the step on one batch held on the device) and
# the loop thread's CPU per step, ResNet-18 and -50, bf16, channels_last,
# batch 128, in each of the two runs (gpu-run, gpu-run-2).
H200_CEILING = {"resnet18": (11_140.0, 11_748.0), "resnet50": (4_171.0, 4_118.0)}
H200_LOOP_CPU_MS = {"resnet18": (6.07, 5.16), "resnet50": (17.32, 16.53)}
# ResNet-18 input-bound, the workers decoding with Pillow: each loader's
# fraction of its run's ceiling in the two runs. The model must land in
# each loader's range, give or take CALIBRATION_TOLERANCE, from the
# workers' measured CPU alone (it is never fitted to these).
H200_INPUT_BOUND_FRACTION = {
    "DataLoader": (4_764 / 11_140, 4_847 / 11_748),  # 0.43, 0.41
    "fastq.torch.DataLoader": (5_846 / 11_140, 5_616 / 11_748),  # 0.52, 0.48
}
# How far outside a loader's measured range the model may land: about the
# spread of its input, the workers' CPU per image, whose three runs lie
# within 3-8% of their median (0.01 to 0.04 of the ceiling). The measured
# range itself holds the two H200 runs' spread (0.02 to 0.04).
CALIBRATION_TOLERANCE = 0.03
H200_CORES = 16  # vCPUs of the host
WORKERS = 15
BATCH = 128
IMAGE_BYTES = 3 * 224 * 224  # a decoded uint8 crop

# ---------------------------------------------------- measured on a CPU

# The train bench's "workers' CPU us/image" column: the bench's pipeline
# (Pillow decode, 224-pixel RandomResizedCrop, flip, uint8 CHW, collate,
# hand-over) per image, over all the workers' processes. 2-vCPU AMD EPYC,
# median of the column over 3 runs: `python -m fastq bench --case train
# --device cpu --model tiny --loader DataLoader,fastq.torch.DataLoader
# --image-size 224 --batch-size 128 --steps 12 --warmup-steps 3 --workers 1
# --repeat 3`
# (benchmarks/results/train-worker-cpu-2core-amd.txt). DataLoader's
# workers pickle each batch through a pipe; fastq's write into the ring.
WORKER_US_PER_IMAGE = {"DataLoader": 3_112.0, "fastq.torch.DataLoader": 2_747.0}
# A vCPU of the H200's Xeon host against one of the AMD machine: taken as
# equal. No workload has been timed on both for this pipeline; the numpy
# compute case has (benchmarks/results/compute-16core-xeon.txt beside
# bench-2core.txt: 72.7 against 63.0 ms a batch on one worker, 1.15), but
# it is float32 arithmetic, not libjpeg-turbo. At 1.15 the model misses
# DataLoader's range: the calibration test says so. The next GPU run's
# train bench prints this column on the H200 itself.
XEON_OVER_AMD = 1.0
# A worker's CPU per image when the GPU decodes: read the file, parse its
# header, draw the box and the flip (fastq.vision's encoded sample):
# `python benchmarks/jpeg_set.py --files 1000`, 2-vCPU AMD
# (benchmarks/results/jpeg-set-2core-amd.txt).
ENCODED_US_PER_IMAGE = 85.0
# Files the hardware engine does not take (progressive, grayscale): 40 of
# the set's 1,000 (the same file).
OTHER_SHARE = 0.04
# A file decoded on a CPU thread outside a worker (nvImageCodec's CPU
# threads, or Pillow on the stage's thread): the pipeline's cost per image
# from the same file (2,505 us), decode and crop together; no cheaper
# figure for the decode alone has been measured.
CPU_DECODE_US_PER_IMAGE = 2_505.0
ENCODED_BYTES = 110_000  # the set's files: 109 KB on average (same file)
# The stage thread's host work per image with the GIL held, besides the
# library's own decode call: the code as it is today, 55 to 90 us (decode
# source 9.2 us, from_dlpack and permute about 6, _resize 24 to 55, timed
# on the CPU with the same calls); the batched stage's target, at most 15.
STAGE_HOST_US_TODAY = (55.0, 90.0)
STAGE_HOST_US_BATCHED = 15.0

# nvImageCodec's CPU threads when the code leaves max_num_cpu_threads at
# 0: one per CPU core (its Decoder's documentation).
NVIMGCODEC_THREADS = H200_CORES

# ------------------------------------------------------------- assumed

# The JPEG engines' rate on the bench's files, all engines together, low
# and middle: NVIDIA's A100 figure through DALI, about 7,000 images/s with
# a quarter of the files on the hybrid decoder (5,000 on the hardware
# alone); and torchvision's 7,800 on an A100 (551 x 676 images, pytorch/
# vision PR #8496) times the H200's 7 NVJPG engines over the A100's 5. No
# figure for the H200 is measured yet: gpu_check.sh's engine part does.
ENGINE_RATES = (7_000.0, 10_900.0)
# The decode call's own host work per image before the engines start on a
# batch (parse the headers, stage the bitstreams): nvImageCodec's hardware
# path waits for its previous batch (cudaEventSynchronize) before it
# submits the next, so with one Decoder the engines idle this long per
# batch. An assumption until gpu_check.sh times the calling thread.
SUBMIT_US_PER_IMAGE = 10.0
# The stage's kernels on the SMs per image (crop, resize, flip, normalize,
# cast, batched): about 0.9 MB moved at a tenth of the H200's 4.8 TB/s.
POST_US_PER_IMAGE = 2.0
# The loop's share when the stage has a thread of its own: take the batch,
# make its stream wait on the batch's event.
HAND_OUT_US_PER_BATCH = 50.0
# Host-to-device copies from page-locked memory, as the torch stand-in has
# them (PCIe 4.0 x16).
COPY_BYTES_PER_S = gpu_model.COPY_BYTES_PER_S
# The loop thread's CPU per step holds the GIL throughout: an upper bound
# (torch lets go of it inside its calls; how much of the 5.6 ms that is
# has not been measured).
LOOP_GIL_SHARE = 1.0


def _mean(pair: tuple[float, float]) -> float:
    return (pair[0] + pair[1]) / 2


def step_gpu_ms(model: str) -> float:
    """The step's GPU time on the H200: its ceiling's step."""
    return BATCH / _mean(H200_CEILING[model]) * 1e3


def step_cpu_ms(model: str) -> float:
    """The loop thread's CPU per step on the H200 (the ceiling's)."""
    return _mean(H200_LOOP_CPU_MS[model])


def ceiling(model: str) -> float:
    """The modelled ceiling, images/s: the H200's step time alone."""
    return BATCH / step_gpu_ms(model) * 1e3


def worker_us(loader: str) -> float:
    """A worker's CPU per image decoding the pipeline on the H200's host."""
    return WORKER_US_PER_IMAGE[loader] * XEON_OVER_AMD


@dataclass(frozen=True)
class Stage:
    """How a GPU-decode row decodes: the backend, the stage's host cost,
    the decoders, and where the second source of capacity is.

    ``backend`` "nvimgcodec" takes a stream and returns once its batch is
    submitted (the files the engine does not take go to its CPU threads
    inside the same call); "torchvision" waits for its decode on the
    stage's thread, and the files the engine does not take are decoded
    with Pillow on that thread. ``worker_share`` of the samples reach the
    stage decoded to pixels by the workers; ``hybrid_share`` of the files
    the engine would take go to ``cpu_threads`` of nvImageCodec's CPU
    decoding instead."""

    name: str
    backend: str = "nvimgcodec"
    host_us: float = STAGE_HOST_US_BATCHED
    decoders: int = 1
    submit_us: float = SUBMIT_US_PER_IMAGE
    worker_share: float = 0.0
    hybrid_share: float = 0.0
    cpu_threads: int = NVIMGCODEC_THREADS

    def but(self, **changes: object) -> Stage:
        return replace(self, **changes)  # type: ignore[arg-type]


def balanced_worker_share(
    engine_rate: float, loader: str = "fastq.torch.DataLoader"
) -> float:
    """The share of samples the workers decode to pixels for the engines and
    the workers to run out together: X (1 - s)(1 - other) = engine_rate
    and X (s pixel + (1 - s) encoded) = WORKERS seconds a second. What a
    default following the measurements picks, from the rates alone."""
    pixel = worker_us(loader) / 1e6
    encoded = ENCODED_US_PER_IMAGE * XEON_OVER_AMD / 1e6
    room = WORKERS * (1 - OTHER_SHARE)
    share = (room - engine_rate * encoded) / (engine_rate * (pixel - encoded) + room)
    return min(1.0, max(0.0, share))
