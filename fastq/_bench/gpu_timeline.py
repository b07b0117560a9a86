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
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .fresh import run_in_turn, run_job, serve_job
from .train_loop import close_loader, epochs, repeat

LOADERS = ("DataLoader", "fastq.torch.DataLoader", "TorchPrefetcher", "ceiling")


@dataclass(frozen=True)
class Shape:
    """A step as measured on an H100 (python -m fastq bench --case train,
    bf16, channels_last, batch 128): GPU time, and the loop thread's
    launch time, per step."""

    gpu_ms: float
    launch_ms: float
    kernels: int  # launches per step: the launch queue holds 1024 of them


# Kernels per step: launch time at about 35 us per launch, PyTorch's
# dispatch and CUDA's launch together.
SHAPES = {
    "resnet50": Shape(gpu_ms=36.0, launch_ms=19.0, kernels=540),
    "resnet18": Shape(gpu_ms=12.0, launch_ms=7.0, kernels=200),
}
# CUDA's launch queue, in kernels: the loop runs this far ahead of the GPU.
LAUNCH_QUEUE = 1024
# A step's kernels are launched in this many pieces (the model's grain).
PIECES = 16
# The measured loaders' input rate: 5,256 images/s from 15 workers
# decoding JPEGs (fastq.torch.DataLoader unpinned, ResNet-18, H100 lease).
WORKERS = 15
INPUT_IMAGES_PER_S = 5256.0


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
    host_bytes: int = 0  # page-locked blocks the caching allocator made
    bad_batches: int = 0
    error: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Run:
        return cls(**{**data, "config": Config(**data["config"])})


class Timed:
    """Map-style dataset: sample i is (a uint8 image, i's label, i); a
    batch of them takes ``batch_s`` in its worker (``__getitems__``, which
    torch's fetcher and fastq's both call), then is collated for real."""

    def __init__(self, n: int, size: int, batch_s: float) -> None:
        self.n = n
        self.image = np.zeros((3, size, size), dtype=np.uint8)
        self.batch_s = batch_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[Any, np.int64, np.int64]:
        return self.image, np.int64(i % 1000), np.int64(i)

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
    batch_s = cfg.workers * cfg.batch_size / cfg.images_per_s
    epoch = cfg.batch_size * (cfg.warmup + cfg.steps + 2 * cfg.workers + 8)
    dataset = Timed(epoch, cfg.image_size, batch_s)
    loader, batches = _open(cfg, dataset, device)
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
    for i in range(cfg.warmup + cfg.steps):
        if i == cfg.warmup:
            gpu.synchronize()
            syncs0 = gpu.waits["MainThread sync"][0]
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
    stats = getattr(loader, "stats", None)
    if stats is not None:
        run.pinned = stats().get("pinned")
    run.host_bytes = gpu.host_bytes
    batches.close()
    close_loader(loader)
    return run


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
        elif cfg.loader == "fastq.torch.DataLoader":
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
    "GPU-timeline model (fastq/_bench/gpu_model.py): a step shaped like the "
    "H100's (ResNet-50: 36 ms on the GPU, 19 ms of launches; ResNet-18: 12 "
    "and 7), launch queue of 1024 kernels, copies at 25 GB/s from "
    "page-locked memory, pin_memory=True; 15 workers making 5,256 "
    "images/s in all (128 x 3 x 112 x 112 uint8 a batch); 150 steps after 60; "
    "medians of {repeats} run(s), each loader in a fresh process"
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
        "loop CPU ms/step | loop's GPU waits | most slots held for the GPU |",
        "|---|---|---|---|---|---|---|---|---|",
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
                f"{max(held) if held else '-'} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(serve_job(Config, measure))
