"""One loader feeding the training benchmark's step, measured in a fresh
interpreter (`python -m fastq._bench.train_loop JOB`, the JOB a Config as
JSON; the Run comes back as JSON on the last line of standard output), so
that no loader's workers, CUDA state or heap reach another's run."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from . import procstat, train_decode
from .fresh import serve_job

# The loaders, in the tables' order; "ceiling" is one batch held on the
# device and trained on again at every step: no loader can do better.
LOADERS = ("DataLoader", "fastq.torch.DataLoader", "TorchPrefetcher", "ceiling")
# The rows whose JPEGs the GPU decodes (fastq/_bench/train_decode.py), run
# by default on a GPU only; every row, in the tables' order.
DECODE_LOADERS = train_decode.DECODE_LOADERS
EVERY_LOADER = (*LOADERS[:-1], *DECODE_LOADERS, LOADERS[-1])
# Seconds between samples of the process tree's PSS: each sample walks
# /proc, and reading a process's smaps holds its memory map's lock.
PSS_INTERVAL_S = 0.5


@dataclass
class Config:
    loader: str
    model: str
    device: str  # "cpu" or "cuda"
    batch_size: int
    workers: int
    steps: int  # measured, after the warm-up steps
    warmup: int  # at least 1: the first batch's step is never measured
    images: int  # files in the dataset (an epoch: images // batch_size steps)
    image_size: int  # the crop's side
    pin_memory: bool
    data: str  # the folder of the files (made beforehand)
    threads: int  # torch's intra-op threads for the step (CPU runs)


@dataclass
class Run:
    config: Config
    images_per_s: float = 0.0
    wait_share: float = 0.0  # of the measured steps' wall time, inside next()
    loop_cpu_ms: float = 0.0  # the loop thread's CPU time per measured step
    first_batch_s: float | None = None  # construction to first batch in hand
    peak_pss: int = 0  # bytes, this process and every process under it
    # What the loop was handed, checked at every step (warm-up included).
    images: int = 0  # images in batches of the expected shape and dtypes
    bad_batches: int = 0
    batch_shape: list[int] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)  # images, labels, indices
    complete: bool | None = None  # each epoch's indices distinct, in range
    # The workers' CPU time (every process under this one) per image over
    # the measured steps, microseconds.
    worker_cpu_us: float = 0.0
    # GPU-decode rows: the decode stage's stats() at the end, and its GPU
    # time per batch where it reports one.
    decode: dict[str, Any] | None = None
    decode_gpu_ms: float | None = None
    error: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Run:
        return cls(**{**data, "config": Config(**data["config"])})


def measure(cfg: Config) -> Run:
    """Runs cfg's loader under the step in this process and measures it."""
    import torch

    from .train_data import Images, file_paths
    from .train_model import classes, make_step

    decoding = cfg.loader in DECODE_LOADERS
    if decoding:
        why = train_decode.problem(cfg.loader, cfg.device)
        if why is not None:
            return Run(cfg, error=f"not available: {why}")

    if cfg.warmup < 1:
        raise ValueError(f"warmup={cfg.warmup}: at least 1 (the first batch's step)")
    device = torch.device(cfg.device)
    if device.type == "cpu":
        torch.set_num_threads(cfg.threads)
    else:
        torch.backends.cudnn.benchmark = True
    step = make_step(cfg.model, device)
    dataset = Images(
        file_paths(cfg.data, cfg.images, cfg.image_size),
        cfg.image_size,
        classes(cfg.model),
    )
    run = Run(cfg)
    pss = procstat.PeakPss(os.getpid(), PSS_INTERVAL_S)
    pss.start()
    t0 = time.perf_counter()
    loader, batches = _open(cfg, dataset, device)
    first = next(batches)
    if cfg.loader != "ceiling":
        run.first_batch_s = time.perf_counter() - t0
    sync: Callable[[], None] = (
        torch.cuda.synchronize if device.type == "cuda" else lambda: None
    )
    expected = (cfg.batch_size, 3, cfg.image_size, cfg.image_size)
    seen: list[Any] = []
    waited = cpu = 0.0
    workers0 = procstat.Counters()
    start = time.perf_counter()
    for i in range(cfg.warmup + cfg.steps):
        if i == cfg.warmup:
            sync()
            pss.sample()
            waited = cpu = 0.0
            workers0 = procstat.tree_counters(procstat.children_of(os.getpid()))
            start = time.perf_counter()
        c0 = time.thread_time()
        w0 = time.perf_counter()
        batch = first if i == 0 else next(batches)
        w1 = time.perf_counter()
        if decoding:  # (images, labels): the stage hands out no index
            images, labels = batch
            index = None
        else:
            images, labels, index = batch
        if i == 0:
            run.batch_shape = list(images.shape)
            run.dtypes = [str(t.dtype) for t in batch]
        if _as_expected(images, labels, index, expected, decoding):
            run.images += images.shape[0]
        else:
            run.bad_batches += 1
        if index is not None:
            seen.append(index.clone())  # a copy: a view would hold its slot
        step(images, labels)
        del batch, images, labels, index
        if i == 0:
            first = None
        c1 = time.thread_time()
        if i >= cfg.warmup:
            waited += w1 - w0
            cpu += c1 - c0
    sync()
    elapsed = time.perf_counter() - start
    workers = procstat.tree_counters(procstat.children_of(os.getpid())) - workers0
    run.peak_pss = pss.stop()
    if decoding:
        run.decode = train_decode.stage_stats(loader)
        run.decode_gpu_ms = train_decode.gpu_ms_per_batch(run.decode)
    batches.close()
    close_loader(loader)
    run.images_per_s = cfg.steps * cfg.batch_size / elapsed
    run.wait_share = waited / elapsed
    run.loop_cpu_ms = cpu / cfg.steps * 1e3
    run.worker_cpu_us = workers.cpu_s / (cfg.steps * cfg.batch_size) * 1e6
    if cfg.loader != "ceiling" and seen:
        run.complete = _every_index(torch.cat(seen).cpu().tolist(), cfg)
    return run


def _as_expected(
    images: Any, labels: Any, index: Any, expected: tuple[int, ...], decoded: bool
) -> bool:
    """A batch of the expected shape and dtypes: uint8 images and int64
    labels and indices from the workers; from the decode stage, images
    normalized already and int64 labels."""
    import torch

    if tuple(images.shape) != expected or labels.dtype != torch.int64:
        return False
    if decoded:  # bf16 on a GPU; float32 where the workers decode instead
        return bool(images.is_floating_point())
    return bool(images.dtype == torch.uint8 and index.dtype == torch.int64)


def _every_index(indices: list[int], cfg: Config) -> bool:
    """Each epoch (drop_last: the batches that fit) handed out distinct
    indices of the dataset, and as many as it should."""
    per_epoch = cfg.images // cfg.batch_size * cfg.batch_size
    if len(indices) != (cfg.warmup + cfg.steps) * cfg.batch_size:
        return False
    for k in range(0, len(indices), per_epoch):
        epoch = indices[k : k + per_epoch]
        if len(set(epoch)) != len(epoch) or not all(0 <= i < cfg.images for i in epoch):
            return False
    return True


def _open(
    cfg: Config, dataset: Any, device: Any
) -> tuple[Any, Generator[Any, None, None]]:
    """(the loader, its batches, running on across epochs)."""
    import torch.utils.data

    common: dict[str, Any] = {
        "batch_size": cfg.batch_size,
        "shuffle": True,
        "drop_last": True,
        "pin_memory": cfg.pin_memory,
    }
    if cfg.loader in DECODE_LOADERS:
        loader = train_decode.open_loader(
            cfg.loader,
            dataset.paths,
            dataset.classes,
            cfg.image_size,
            device,
            common,
            cfg.workers,
        )
        return loader, epochs(loader)
    if cfg.loader == "ceiling":
        samples = [dataset[i] for i in range(cfg.batch_size)]
        held = tuple(
            torch.stack([torch.as_tensor(s[k]) for s in samples]).to(device)
            for k in range(3)
        )
        return None, repeat(held)
    loader: Any
    if cfg.loader == "TorchPrefetcher":
        from ..torch import TorchPrefetcher

        loader = TorchPrefetcher(
            dataset,
            workers=cfg.workers,
            device=device if device.type == "cuda" else None,
            **common,
        )
    else:
        if cfg.loader == "DataLoader":
            cls: Any = torch.utils.data.DataLoader
        elif cfg.loader == "fastq.torch.DataLoader":
            from ..torch import DataLoader as cls
        else:
            raise ValueError(f"loader={cfg.loader!r}: choose from {EVERY_LOADER}")
        loader = cls(
            dataset, num_workers=cfg.workers, persistent_workers=True, **common
        )
    return loader, epochs(loader)


def repeat(batch: Any) -> Generator[Any, None, None]:
    while True:
        yield batch


def epochs(loader: Any) -> Generator[Any, None, None]:
    # A new epoch's first batch is waited for inside next(), as in a loop
    # that runs `for epoch ...: for batch in loader`.
    while True:
        yield from loader


def close_loader(loader: Any) -> None:
    if loader is None:
        return
    close = getattr(loader, "close", None)
    if close is not None:
        close()
        return
    it = getattr(loader, "_iterator", None)
    if it is not None:
        it._shutdown_workers()


if __name__ == "__main__":
    sys.exit(serve_job(Config, measure))
