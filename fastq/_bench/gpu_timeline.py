"""`python -m fastq bench --case gpu-model`: the training benchmark's GPU
loop on the GPU-timeline model (fastq/_bench/gpu_model.py), so that the
pinned path is measured on any machine.

Each loader feeds a step shaped like a measured one: its copies to the
device (``non_blocking``, ``pin_memory=True``), then the step's kernels,
launched from the loop's thread (launch time there) and run on the model
GPU (GPU time there). Workers make batches at a set rate (a sleep per
batch, then the real collate into the loader's memory), so a step is
GPU-bound or input-bound as its shape says. Each loader runs in a fresh
interpreter (`python -m fastq._bench.gpu_timeline JOB`), the JOB a Config as
JSON; the Run comes back as JSON on the last line of standard output."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from . import decode_model
from .fresh import run_in_turn, run_job, serve_job
from .train_loop import close_loader, epochs, repeat

# The GPU-decode rows: fastq.torch.DataLoader's batches of encoded bytes
# go to the decode stage of decode_model, which runs on a thread of its own
# (as fastq.torch's does) and on the model's JPEG engine, with each
# backend's way of calling it. The files the engine does not take are
# decoded with Pillow by the workers, or (the last row) on the stage's
# thread.
FALLBACK_ON_STAGE = "GPU decode: nvImageCodec, Pillow files on the stage's thread"
DECODE_LOADERS = (
    "GPU decode: nvImageCodec",
    "GPU decode: torchvision",
    FALLBACK_ON_STAGE,
)
# Decoded batches the stage keeps ready ahead of the loop (fastq.torch's
# DECODE_LOOKAHEAD).
LOOKAHEAD = 2
LOADERS = (
    "DataLoader",
    "fastq.torch.DataLoader",
    "TorchPrefetcher",
    *DECODE_LOADERS,
    "ceiling",
)


@dataclass(frozen=True)
class Shape:
    """A step as measured on the H200 (python -m fastq bench --case train,
    bf16, channels_last, batch 128; decode_model's calibration): GPU time
    (the ceiling's step), and the loop thread's launch time, per step."""

    gpu_ms: float
    launch_ms: float
    kernels: int  # launches per step: the launch queue holds 1024 of them


def _h200(model: str, kernels: int) -> Shape:
    gpu_ms, launch_ms = decode_model.h200_step_ms(model)
    return Shape(gpu_ms=gpu_ms, launch_ms=launch_ms, kernels=kernels)


# Kernels per step: launch time at about 35 us per launch, PyTorch's
# dispatch and CUDA's launch together (measured on an H100: ResNet-50 19 ms
# of launches, ResNet-18 7 ms).
SHAPES = {"resnet50": _h200("resnet50", 540), "resnet18": _h200("resnet18", 200)}
# CUDA's launch queue, in kernels: the loop runs this far ahead of the GPU.
LAUNCH_QUEUE = 1024
# A step's kernels are launched in this many pieces (the model's grain).
PIECES = 16
# The measured loaders' input rate: 15 workers decoding about 390 JPEGs/s
# each on the H200's host.
WORKERS = decode_model.WORKERS
INPUT_IMAGES_PER_S = WORKERS * decode_model.CPU_DECODE_PER_WORKER
# The encoded bytes of an image, a quarter of the set's 110 KB as the
# decoded image is a quarter of the measured one (112-pixel side): a 2-core
# machine's memcpy then bounds no loader.
ENCODED_BYTES = decode_model.ENCODED_BYTES // 4


@dataclass
class Config:
    loader: str
    model: str
    batch_size: int = 128
    # Half the measured side: a 2-core machine's memcpy then bounds no
    # loader (the copies' share of the GPU's time is small at either size).
    image_size: int = 112
    workers: int = WORKERS
    images_per_s: float = INPUT_IMAGES_PER_S  # all workers together
    # The warm-up drains what the loaders made before the loop began (up to
    # two batches a worker, and fastq's ring), so that the measured steps
    # run at the workers' steady rate.
    steps: int = 150
    warmup: int = 60
    # The GPU-decode rows: the JPEG engine's rate.
    decode_images_per_s: float = decode_model.DECODE_IMAGES_PER_S


@dataclass
class Run:
    config: Config
    images_per_s: float = 0.0
    wait_share: float = 0.0
    loop_cpu_ms: float = 0.0  # the loop thread's CPU per step (launches are sleeps)
    # The loop thread's waits for the GPU during the measured steps, other
    # than for room in the launch queue (which is running ahead, not
    # waiting): a synchronize, a blocking copy.
    loop_gpu_waits: int = 0
    pinned: dict[str, Any] | None = None  # fastq's stats()["pinned"]
    # The GPU-decode rows: the decode engine's share of the measured time.
    engine_busy: float = 0.0
    host_bytes: int = 0  # page-locked blocks the caching allocator made
    bad_batches: int = 0
    error: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Run:
        return cls(**{**data, "config": Config(**data["config"])})


class Timed:
    """Map-style dataset: sample i is (``sample``, i's label, i), where
    ``sample`` is a uint8 image or a file's encoded bytes; a batch of them
    takes ``batch_s`` in its worker (``__getitems__``, which torch's
    fetcher and fastq's both call), then is collated for real."""

    def __init__(self, n: int, sample: np.ndarray[Any, Any], batch_s: float) -> None:
        self.n = n
        self.sample = sample
        self.batch_s = batch_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[Any, np.int64, np.int64]:
        return self.sample, np.int64(i % 1000), np.int64(i)

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        time.sleep(self.batch_s)
        return [self[i] for i in indices]


def measure(cfg: Config) -> Run:
    """Runs cfg's loader under the modelled step in this process."""
    from .gpu_model import install

    shape = SHAPES[cfg.model]
    gpu = install(LAUNCH_QUEUE * PIECES // shape.kernels)
    import torch

    device = torch.device("cuda", 0)
    epoch = cfg.batch_size * (cfg.warmup + cfg.steps + 2 * cfg.workers + 8)
    decoding = cfg.loader in DECODE_LOADERS
    if decoding:
        sample = np.zeros(ENCODED_BYTES, dtype=np.uint8)
        batch_s = decode_model.worker_s_per_batch(
            cfg.batch_size, fallback=cfg.loader != FALLBACK_ON_STAGE
        )
    else:
        sample = np.zeros((3, cfg.image_size, cfg.image_size), dtype=np.uint8)
        batch_s = cfg.workers * cfg.batch_size / cfg.images_per_s
    dataset = Timed(epoch, sample, batch_s)
    loader, batches = _open(cfg, dataset, device)
    engine = None
    if decoding:
        engine = gpu.jpeg_engine(cfg.decode_images_per_s)
        batches = _decoded(cfg, gpu, engine, batches, device)
    launch_s = shape.launch_ms / 1e3 / PIECES
    gpu_s = shape.gpu_ms / 1e3 / PIECES
    stream = gpu.default

    def step(images: Any, labels: Any) -> None:
        if images.device.type == "cpu":
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
        for _ in range(PIECES):
            time.sleep(launch_s)
            gpu.launch(stream, gpu_s)

    run = Run(cfg)
    waited = cpu = 0.0
    start = time.perf_counter()
    expected = (cfg.batch_size, 3, cfg.image_size, cfg.image_size)
    busy0 = 0.0
    for i in range(cfg.warmup + cfg.steps):
        if i == cfg.warmup:
            gpu.synchronize()
            syncs0 = gpu.waits["MainThread sync"][0]
            busy0 = 0.0 if engine is None else engine.busy_s
            waited = cpu = 0.0
            start = time.perf_counter()
        c0 = time.thread_time()
        w0 = time.perf_counter()
        images, labels, _ = next(batches)
        w1 = time.perf_counter()
        if tuple(images.shape) != expected:
            run.bad_batches += 1
        step(images, labels)
        del images, labels, _
        if i >= cfg.warmup:
            waited += w1 - w0
            cpu += time.thread_time() - c0
    run.loop_gpu_waits = int(gpu.waits["MainThread sync"][0] - syncs0)
    gpu.synchronize()  # the bench's own, as the real one's
    elapsed = time.perf_counter() - start
    run.images_per_s = cfg.steps * cfg.batch_size / elapsed
    run.wait_share = waited / elapsed
    run.loop_cpu_ms = cpu / cfg.steps * 1e3
    if engine is not None:
        run.engine_busy = (engine.busy_s - busy0) / elapsed
    stats = getattr(loader, "stats", None)
    if stats is not None:
        run.pinned = stats().get("pinned")
    run.host_bytes = gpu.host_bytes
    batches.close()
    close_loader(loader)
    return run


def _decoded(
    cfg: Config, gpu: Any, engine: Any, batches: Any, device: Any
) -> Iterator[Any]:
    """The decode stage on the model, on a thread of its own that keeps
    LOOKAHEAD decoded batches ready: per batch, the encoded bytes copied on
    the stage's stream, the backend's call (and the Pillow files where
    they are its), the engine's decode after the copy (waited for on that
    thread where the backend blocks), the stage's kernels on its stream
    after the decode, an event. The loop's thread takes each batch and
    makes its stream wait for the event. Yields the decoded batch as device
    tensors."""
    import queue
    import threading

    import torch

    backend = decode_model.BACKENDS[cfg.loader.split(": ", 1)[1].split(",")[0]]
    stream = gpu.new_stream()
    host_s = cfg.batch_size * decode_model.HOST_US_PER_IMAGE / 1e6
    post_s = cfg.batch_size * decode_model.POST_US_PER_IMAGE / 1e6
    engine_images = round(cfg.batch_size * (1 - decode_model.OTHER_SHARE))
    if cfg.loader == FALLBACK_ON_STAGE:
        host_s += (cfg.batch_size - engine_images) / decode_model.CPU_DECODE_PER_WORKER
    shape = (cfg.batch_size, 3, cfg.image_size, cfg.image_size)
    ready: queue.Queue[Any] = queue.Queue(LOOKAHEAD)
    stop = threading.Event()

    def decode_ahead() -> None:
        with gpu.use_stream(stream):
            for data, labels, _ in batches:
                data.to(device, non_blocking=True)
                copied = stream.record_event()
                time.sleep(host_s)
                done = engine.decode(engine_images, after=copied)
                if backend.blocking:
                    done.synchronize()
                stream.wait_event(done)
                gpu.launch(stream, post_s)
                item = (stream.record_event(), labels)
                while not stop.is_set():
                    try:
                        ready.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
        ready.put(None)

    thread = threading.Thread(target=decode_ahead, name="stage", daemon=True)
    thread.start()
    try:
        while True:
            item = ready.get()
            if item is None:
                return
            done, labels = item
            gpu.default.wait_event(done)
            yield torch.empty(shape, device="meta"), labels, None
    finally:
        stop.set()
        thread.join()


def _open(cfg: Config, dataset: Timed, device: Any) -> tuple[Any, Any]:
    import torch
    import torch.utils.data

    if cfg.loader == "ceiling":
        held = (
            torch.empty(
                (cfg.batch_size, 3, cfg.image_size, cfg.image_size), device="meta"
            ),
            torch.empty(cfg.batch_size, dtype=torch.int64, device="meta"),
            None,
        )
        return None, repeat(held)
    common: dict[str, Any] = {
        "batch_size": cfg.batch_size,
        "shuffle": True,
        "drop_last": True,
    }
    loader: Any
    if cfg.loader == "TorchPrefetcher":
        from ..torch import TorchPrefetcher

        loader = TorchPrefetcher(dataset, workers=cfg.workers, device=device, **common)
    else:
        if cfg.loader == "DataLoader":
            cls: Any = torch.utils.data.DataLoader
        elif cfg.loader in ("fastq.torch.DataLoader", *DECODE_LOADERS):
            from ..torch import DataLoader as cls
        else:
            raise ValueError(f"loader={cfg.loader!r}: choose from {LOADERS}")
        loader = cls(
            dataset,
            num_workers=cfg.workers,
            persistent_workers=True,
            pin_memory=True,
            **common,
        )
    return loader, epochs(loader)


# ------------------------------------------------------------ the case


INTRO = (
    "GPU-timeline model (fastq/_bench/gpu_model.py), calibrated to the "
    "H200's figures: a step shaped like the H200's (ResNet-50: {r50:.1f} ms "
    "on the GPU, {l50:.1f} ms of launches; ResNet-18: {r18:.1f} and {l18:.1f}), "
    "launch queue of 1024 kernels, copies at 25 GB/s from page-locked memory, "
    "pin_memory=True; 15 workers making {input:,.0f} images/s in all (128 x 3 "
    "x 112 x 112 uint8 a batch). GPU decode rows: the workers read, parse and "
    "draw boxes ({worker:.1f} ms a batch each), the stage decodes on a "
    "thread of its own, {ahead} batches ahead, on a JPEG engine of "
    "{rate:,.0f} images/s (nvImageCodec: on a stream; torchvision: the call "
    "waits for it on the stage's thread); the loop's thread only takes each "
    "batch and makes its stream wait; the files the engine does not take "
    "({other:.0%}) decoded with Pillow by the workers, or on the stage's "
    "thread in the last row. "
    "150 steps after 60; medians of {repeats} run(s), each loader in a fresh "
    "process. A model, not a GPU's measurement"
)


def intro(repeats: int) -> str:
    return INTRO.format(
        r50=SHAPES["resnet50"].gpu_ms,
        l50=SHAPES["resnet50"].launch_ms,
        r18=SHAPES["resnet18"].gpu_ms,
        l18=SHAPES["resnet18"].launch_ms,
        input=INPUT_IMAGES_PER_S,
        worker=decode_model.worker_s_per_batch(128) * 1e3,
        rate=decode_model.DECODE_IMAGES_PER_S,
        ahead=LOOKAHEAD,
        other=decode_model.OTHER_SHARE,
        repeats=repeats,
    )


def plan(models: Sequence[str]) -> list[Config]:
    return [Config(loader, model) for model in models for loader in LOADERS]


def run_once(cfg: Config, timeout_s: float = 600.0) -> Run:
    """One run in a fresh interpreter."""
    return run_job(
        "fastq._bench.gpu_timeline",
        asdict(cfg),
        Run.from_json,
        lambda why: Run(cfg, error=why),
        timeout_s,
    )


def run_all(
    configs: Sequence[Config],
    repeats: int,
    progress: Callable[[Run], None] | None = None,
) -> list[Run]:
    """Every config ``repeats`` times, interleaved."""
    return run_in_turn(configs, repeats, run_once, progress)


def describe(r: Run) -> str:
    c = r.config
    if r.error:
        return f"{c.model} {c.loader}: {r.error}"
    return (
        f"{c.model} {c.loader}: {r.images_per_s:,.0f} img/s, waits "
        f"{r.wait_share:.0%}, loop CPU {r.loop_cpu_ms:.1f} ms/step, "
        f"loop waits for the GPU {r.loop_gpu_waits}"
        + (f", decode engine busy {r.engine_busy:.0%}" if r.engine_busy else "")
    )


def _median(runs: Sequence[Run], key: Callable[[Run], float]) -> float:
    return statistics.median(key(r) for r in runs)


def table(runs: Sequence[Run]) -> str:
    """Medians per (model, loader), with ratios to the ceiling and to
    DataLoader."""
    by: dict[tuple[str, str], list[Run]] = {}
    for r in runs:
        if r.error is None:
            by.setdefault((r.config.model, r.config.loader), []).append(r)
    lines = [
        "| model | loader | img/s | of the ceiling | x DataLoader | waits | "
        "loop CPU ms/step | loop's GPU waits | most slots held for the GPU | "
        "decode engine busy |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for model in dict.fromkeys(r.config.model for r in runs):
        ceiling = by.get((model, "ceiling"))
        base = by.get((model, "DataLoader"))
        top = _median(ceiling, lambda r: r.images_per_s) if ceiling else float("nan")
        dl = _median(base, lambda r: r.images_per_s) if base else float("nan")
        for loader in LOADERS:
            rs = by.get((model, loader))
            if not rs:
                continue
            ips = _median(rs, lambda r: r.images_per_s)
            held = [r.pinned["peak_device_held"] for r in rs if r.pinned]
            lines.append(
                f"| {model} | {loader} | {ips:,.0f} | {ips / top:.2f} | "
                f"{ips / dl:.2f} | {_median(rs, lambda r: r.wait_share):.0%} | "
                f"{_median(rs, lambda r: r.loop_cpu_ms):.1f} | "
                f"{_median(rs, lambda r: r.loop_gpu_waits):.0f} | "
                f"{max(held) if held else '-'} | "
                + (
                    f"{_median(rs, lambda r: r.engine_busy):.0%} |"
                    if loader in DECODE_LOADERS
                    else "- |"
                )
            )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(serve_job(Config, measure))
