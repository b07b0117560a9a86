"""What the GPU-timeline model (fastq/_bench/gpu_model.py) knows of a
training loop whose JPEGs the GPU decodes: the figures it is calibrated to
(one H200 with a 16-vCPU host, benchmarks/results/gpu-run*), the decode
stage's parameters and where each comes from, the stage as the model runs
it, and the steady state it predicts, in closed form.

A model, not a measurement: `benchmarks/gpu_check.sh` measures the same
rows on a GPU, so that each parameter below can be replaced by what the
GPU gives."""

from __future__ import annotations

from dataclasses import dataclass

from .gpu_model import COPY_BYTES_PER_S

# ------------------------------------------------------- the calibration

# One NVIDIA H200, 16-vCPU Xeon host, torch 2.11, `python -m fastq bench
# --case train --workers 15`, ResNet-18 and -50, bf16, channels_last, batch
# 128, pin_memory=True (benchmarks/results/gpu-run and gpu-run-2, one run
# per loader on each of two machines).
H200_CEILING = {"resnet18": (11_140.0, 11_748.0), "resnet50": (4_171.0, 4_118.0)}
H200_LOOP_CPU_MS = {"resnet18": (6.07, 5.16), "resnet50": (17.32, 16.53)}
# ResNet-18, input-bound: each loader's images/s in the two runs.
H200_INPUT_BOUND = {
    "DataLoader": (4_764.0, 4_847.0),
    "fastq.torch.DataLoader": (5_846.0, 5_616.0),
    "TorchPrefetcher": (5_269.0, 5_741.0),
}
# The recorded fractions of the ceiling, input-bound: 0.41 to 0.52.
H200_FRACTIONS = (0.41, 0.52)
WORKERS = 15
BATCH = 128
# A worker decoding JPEGs as the pipeline does: about 390 a second on the
# H200's host (fastq's 5,846 images/s over 15 workers; the issue's figure).
CPU_DECODE_PER_WORKER = 390.0


def _mean(pair: tuple[float, float]) -> float:
    return (pair[0] + pair[1]) / 2


def h200_step_ms(model: str) -> tuple[float, float]:
    """(GPU ms, launch ms) of one step on the H200: the ceiling's step time
    (one batch reused: the GPU's alone) and its loop thread's CPU."""
    return BATCH / _mean(H200_CEILING[model]) * 1e3, _mean(H200_LOOP_CPU_MS[model])


# ------------------------------------------------------- the decode stage

# The GPU's JPEG decoder, images/s: torchvision's batched
# decode_jpeg(device="cuda") decoded 1,000 images of 551 x 676 in 128 ms on
# one A100, about 7,800 a second (pytorch/vision PR #8496). Neither backend
# has a published figure on Hopper; nvImageCodec drives the same nvJPEG
# hardware engine, so both take this rate until gpu_check.sh measures them.
DECODE_IMAGES_PER_S = 7_800.0
# That figure's pixels per image: a rate in pixels would give the bench's
# smaller files (0.19 MP on average, benchmarks/results/jpeg-set-*) about
# twice as many images a second; the rows scaled so say so.
DECODE_REFERENCE_MP = 551 * 676 / 1e6
SET_MEAN_MP = 0.193
# Resize with antialiasing, flip, normalize, bf16, channels_last: kernels on
# the SMs, per image. An assumption: about 0.6 MB read and 0.3 MB written
# per image at a tenth of the H200's 4.8 TB/s is 2 us; gpu_check.sh prints
# the stage's GPU time per batch.
POST_US_PER_IMAGE = 2.0
# The backend call's CPU on the calling thread per image (parsing the
# headers, queueing the decode): an assumption until measured.
HOST_US_PER_IMAGE = 20.0
# A worker's CPU per image when it only reads the file, its header and
# draws the box and flip (fastq.vision's encoded sample): 85 us on the
# 2-vCPU AMD machine where the bench's PIL pipeline took 2,505 us
# (benchmarks/results/jpeg-set-2core-amd.txt); the same share of the H200
# host's 1/390 s.
WORKER_SHARE_OF_DECODE = 85 / 2505
# Files the hardware engine does not take (progressive, grayscale: 2% each
# in the bench's set), decoded per image on the CPU as the pipeline does.
OTHER_SHARE = 0.04
# The encoded bytes copied to the device: 110 KB a file on average.
ENCODED_BYTES = 110_000


def worker_s_per_batch(batch: int, fallback: bool = True) -> float:
    """A worker's time for a batch when the GPU decodes: read, header and
    box for every file, and (``fallback``) the pipeline's CPU decode for
    the files the engine does not take (which the workers have the CPU
    for)."""
    decode = OTHER_SHARE * (1 - WORKER_SHARE_OF_DECODE) if fallback else 0.0
    return batch * (WORKER_SHARE_OF_DECODE + decode) / CPU_DECODE_PER_WORKER


@dataclass(frozen=True)
class Backend:
    """A decoder as the model sees it: the engine's rate, and whether its
    call waits for the decode on the calling thread (torchvision's
    decode_jpeg synchronizes its own stream) or takes a stream
    (nvImageCodec)."""

    name: str
    blocking: bool
    images_per_s: float = DECODE_IMAGES_PER_S


BACKENDS = {
    "nvImageCodec": Backend("nvImageCodec", blocking=False),
    "torchvision": Backend("torchvision", blocking=True),
}

# Where the stage's work runs: a thread of its own (NOTE [ The decode
# stage's thread ] in fastq/torch/_decode_thread.py), or, as before it, the
# loop's thread (kept as a row to compare).
STAGE_THREAD = "stage thread"
LOOP_THREAD = "loop thread"
# The loop's share when the stage has a thread of its own: take the decoded
# batch from the queue, make the stream wait on its event, record the
# output's use on it; a few dozen us a batch, an assumption.
HAND_OUT_US_PER_BATCH = 50.0


@dataclass(frozen=True)
class Prediction:
    model: str
    row: str
    engine_images_per_s: float | None  # None: the workers decode
    fallback: str  # where files the engine does not take are decoded
    images_per_s: float
    of_ceiling: float
    bound_by: str  # the resource that sets the rate
    costs_ms: dict[str, float]  # per step, each resource


def ceiling(model: str) -> float:
    """The modelled ceiling, images/s: the H200's step time alone."""
    return BATCH / h200_step_ms(model)[0] * 1e3


def predict_today(model: str, per_worker: float = CPU_DECODE_PER_WORKER) -> Prediction:
    """Today's loaders (the workers decode): the slower of the workers and
    the GPU's step."""
    gpu_ms, launch_ms = h200_step_ms(model)
    costs = {
        "GPU compute": gpu_ms,
        "workers": BATCH / (WORKERS * per_worker) * 1e3,
        "loop thread": launch_ms,
    }
    return _steady(model, "workers decode (today)", None, "workers", costs)


def predict_gpu_decode(
    model: str,
    backend: Backend,
    *,
    stage: str = STAGE_THREAD,
    fallback: str = "workers",
    engine_images_per_s: float | None = None,
) -> Prediction:
    """The GPU decodes: the steady state is the slowest of the resources a
    step uses. Each one's cost per step, in ms: the SMs (the step and the
    stage's kernels), the decode engine, the copy engine (the encoded
    bytes), the workers (read, header, box; and the files the engine does
    not take, if ``fallback`` is "workers"), the thread the stage runs on
    (``stage``: the backend call, the decode itself where the call blocks
    it, the files the engine does not take if ``fallback`` names it), and
    the loop's thread (the step's launches, and the stage's work where
    ``stage`` is the loop's thread; else the hand-out alone)."""
    gpu_ms, launch_ms = h200_step_ms(model)
    rate = backend.images_per_s if engine_images_per_s is None else engine_images_per_s
    decode_ms = BATCH * (1 - OTHER_SHARE) / rate * 1e3
    fallback_ms = BATCH * OTHER_SHARE / CPU_DECODE_PER_WORKER * 1e3
    stage_ms = BATCH * HOST_US_PER_IMAGE / 1e3
    worker_ms = worker_s_per_batch(BATCH, fallback == "workers") * 1e3
    if fallback != "workers":
        stage_ms += fallback_ms
    if backend.blocking:
        stage_ms += decode_ms
    costs = {
        "GPU compute": gpu_ms + BATCH * POST_US_PER_IMAGE / 1e3,
        "decode engine": decode_ms,
        "copy engine": BATCH * ENCODED_BYTES / COPY_BYTES_PER_S * 1e3,
        "workers": worker_ms / WORKERS,
    }
    if stage == LOOP_THREAD:
        costs["loop thread"] = launch_ms + stage_ms
        row = f"GPU decode, {backend.name}, stage on the loop thread (before)"
    else:
        costs["loop thread"] = launch_ms + HAND_OUT_US_PER_BATCH / 1e3
        costs["stage thread"] = stage_ms
        row = f"GPU decode, {backend.name}"
    return _steady(model, row, rate, fallback, costs)


def _steady(
    model: str,
    row: str,
    rate: float | None,
    fallback: str,
    costs: dict[str, float],
) -> Prediction:
    bound = max(costs, key=lambda k: costs[k])
    images = BATCH / costs[bound] * 1e3
    return Prediction(
        model, row, rate, fallback, images, images / ceiling(model), bound, costs
    )


def scaled_rate(rate: float = DECODE_IMAGES_PER_S) -> float:
    """The engine's rate in images/s of the bench's set if it decodes a
    constant number of pixels a second."""
    return rate * DECODE_REFERENCE_MP / SET_MEAN_MP


def predictions(models: tuple[str, ...] = ("resnet18", "resnet50")) -> list[Prediction]:
    """Every row the case prints: the stage on its own thread, the files
    the engine does not take decoded by the workers or on the stage's
    thread; and, to compare, the stage on the loop's thread as before."""
    rows: list[Prediction] = []
    nvimgcodec = BACKENDS["nvImageCodec"]
    for model in models:
        rows.append(predict_today(model))
        for backend in BACKENDS.values():
            rows.append(predict_gpu_decode(model, backend))
        rows.append(predict_gpu_decode(model, nvimgcodec, fallback=STAGE_THREAD))
        for backend in BACKENDS.values():
            rows.append(predict_gpu_decode(model, backend, stage=LOOP_THREAD))
        rows.append(
            predict_gpu_decode(
                model, nvimgcodec, stage=LOOP_THREAD, fallback=LOOP_THREAD
            )
        )
        for backend in BACKENDS.values():
            rows.append(
                predict_gpu_decode(model, backend, engine_images_per_s=scaled_rate())
            )
    return rows


INTRO = (
    "The decode stage on the model, in closed form (fastq/_bench/"
    "decode_model.py): calibrated to the H200's figures (step {r18:.1f} ms "
    "ResNet-18, {r50:.1f} ms ResNet-50; 15 workers decoding 390 JPEGs/s "
    "each); the decode engine at {rate:,.0f} images/s (torchvision's batched "
    "nvJPEG on an A100, pytorch/vision PR #8496) or scaled to the set's "
    "pixels ({scaled:,.0f}/s); stage kernels {post:g} us/image on the SMs, "
    "backend call {host:g} us/image on the stage's thread, {hand:g} us a "
    "batch on the loop's to hand a batch out, {other:.0%} of files decoded "
    "on a CPU. A model, not a GPU's measurement"
)


def intro() -> str:
    return INTRO.format(
        r18=h200_step_ms("resnet18")[0],
        r50=h200_step_ms("resnet50")[0],
        rate=DECODE_IMAGES_PER_S,
        scaled=scaled_rate(),
        post=POST_US_PER_IMAGE,
        host=HOST_US_PER_IMAGE,
        hand=HAND_OUT_US_PER_BATCH,
        other=OTHER_SHARE,
    )


def table(rows: list[Prediction] | None = None) -> str:
    lines = [
        "| model | row | engine images/s | fallback files on | images/s | "
        "of the ceiling | bound by |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in predictions() if rows is None else rows:
        rate = "-" if p.engine_images_per_s is None else f"{p.engine_images_per_s:,.0f}"
        lines.append(
            f"| {p.model} | {p.row} | {rate} | {p.fallback} | "
            f"{p.images_per_s:,.0f} | {p.of_ceiling:.2f} | {p.bound_by} |"
        )
    return "\n".join(lines)
