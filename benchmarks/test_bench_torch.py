"""fastq next to torch's DataLoader feeding a training step, at the same
number of worker processes: samples/s into a CPU step, and (where a GPU is
there) into a GPU step with pin_memory=True on both sides.

    pytest benchmarks/test_bench_torch.py --benchmark-only

Each case starts its loader, warms it up for one epoch, then pytest-benchmark
times rounds of one epoch each. The "step alone" case trains on one batch
held in memory: the ceiling that no loader can beat. Choose worker counts
with FASTQ_BENCH_TORCH_WORKERS (default "1,2") and rounds with
FASTQ_BENCH_TORCH_ROUNDS (default 5).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from fastq.torch import TorchPrefetcher  # noqa: E402

pytestmark = pytest.mark.torch

WORKER_COUNTS = [
    int(w) for w in os.environ.get("FASTQ_BENCH_TORCH_WORKERS", "1,2").split(",")
]
ROUNDS = int(os.environ.get("FASTQ_BENCH_TORCH_ROUNDS", "5"))
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(
    not CUDA, reason="needs a CUDA device (torch.cuda.is_available() is False)"
)


class BankImages:
    """Images drawn from a small bank, flipped on odd indices (a cheap
    augmentation), with their labels: the loader's own cost dominates."""

    def __init__(self, n: int, shape: tuple[int, ...], classes: int = 10) -> None:
        self.n = n
        self.classes = classes
        rng = np.random.default_rng(0)
        self.bank = rng.integers(0, 256, (16, *shape), dtype=np.uint8)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.ndarray[Any, Any], np.int64]:
        image = self.bank[i % 16]
        if i & 1:
            # Contiguous, as DataLoader's collate needs (torch has no
            # negative strides); fastq would take the view as it is.
            image = np.ascontiguousarray(image[:, :, ::-1])
        return image, np.int64(i % self.classes)


class TinyCNN(nn.Module):
    """Compute-bound step: two small convolutions, then a linear head."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.head = nn.Linear(16 * (size // 4) ** 2, 10)

    def forward(self, x: Any) -> Any:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.head(x.flatten(1))


class PoolLinear(nn.Module):
    """Light step on big images: the loader's bytes/s shows."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.head = nn.Linear(3 * (size // 8) ** 2, 10)

    def forward(self, x: Any) -> Any:
        return self.head(F.avg_pool2d(x, 8).flatten(1))


# name: (image shape, batch size, batches per epoch, model)
WORKLOADS: dict[str, tuple[tuple[int, int, int], int, int, type[nn.Module]]] = {
    "cnn-3x32x32": ((3, 32, 32), 64, 32, TinyCNN),
    "linear-3x128x128": ((3, 128, 128), 128, 48, PoolLinear),
}


def make_step(workload: str, device: Any) -> Callable[[Any, Any], None]:
    shape, _, _, model_cls = WORKLOADS[workload]
    torch.manual_seed(0)
    model = model_cls(shape[-1]).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(images: Any, labels: Any) -> None:
        x = images.to(device, non_blocking=True).float().div_(255)
        y = labels.to(device, non_blocking=True)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def fastq_loader(workload: str, workers: int, **kwargs: Any) -> TorchPrefetcher:
    shape, batch, batches, _ = WORKLOADS[workload]
    return TorchPrefetcher(
        BankImages(batch * batches, shape), batch_size=batch, workers=workers, **kwargs
    )


def torch_loader(workload: str, workers: int, pin_memory: bool) -> Any:
    shape, batch, batches, _ = WORKLOADS[workload]
    return torch.utils.data.DataLoader(
        BankImages(batch * batches, shape),
        batch_size=batch,
        num_workers=workers,
        persistent_workers=True,
        pin_memory=pin_memory,
    )


@pytest.fixture
def cpu_threads() -> Iterator[None]:
    """One intra-op thread for the step: the workers use the other CPUs,
    and oversubscribed OpenMP threads spin against them."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def run(
    benchmark: Any,
    loader: Any,
    step: Callable[[Any, Any], None],
    samples: int,
    sync: Callable[[], None] = lambda: None,
) -> None:
    def epoch() -> None:
        for images, labels in loader:
            step(images, labels)
        sync()

    epoch()  # warm-up: workers started, caches and allocators warm
    times: list[float] = []

    def timed() -> None:
        t0 = time.perf_counter()
        epoch()
        times.append(time.perf_counter() - t0)

    benchmark.pedantic(timed, rounds=ROUNDS, iterations=1)
    benchmark.extra_info["samples_per_round"] = samples
    benchmark.extra_info["samples_per_s"] = round(samples / min(times), 1)
    benchmark.extra_info["samples_per_s_median"] = round(
        samples / float(np.median(times)), 1
    )


def close(loader: Any) -> None:
    if isinstance(loader, TorchPrefetcher):
        loader.close()
    else:
        it = getattr(loader, "_iterator", None)
        if it is not None:
            it._shutdown_workers()


# ----------------------------------------------------------------- CPU


@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_cpu_step_alone(benchmark: Any, workload: str, cpu_threads: None) -> None:
    shape, batch, batches, _ = WORKLOADS[workload]
    benchmark.group = f"CPU step {workload}"
    ds = BankImages(batch, shape)
    images = torch.from_numpy(np.stack([ds[i][0] for i in range(batch)]))
    labels = torch.tensor([int(ds[i][1]) for i in range(batch)])
    run(
        benchmark,
        [(images, labels)] * batches,
        make_step(workload, "cpu"),
        batch * batches,
    )


@pytest.mark.parametrize("loader_workers", WORKER_COUNTS)
@pytest.mark.parametrize("loader_kind", ["fastq", "DataLoader"])
@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_cpu_step(
    benchmark: Any,
    workload: str,
    loader_kind: str,
    loader_workers: int,
    cpu_threads: None,
) -> None:
    _, batch, batches, _ = WORKLOADS[workload]
    benchmark.group = f"CPU step {workload}"
    if loader_kind == "fastq":
        loader = fastq_loader(workload, loader_workers)
    else:
        loader = torch_loader(workload, loader_workers, pin_memory=False)
    try:
        run(benchmark, loader, make_step(workload, "cpu"), batch * batches)
    finally:
        close(loader)


# ----------------------------------------------------------------- GPU


@needs_cuda
@pytest.mark.parametrize("loader_workers", WORKER_COUNTS)
@pytest.mark.parametrize(
    "loader_kind", ["fastq pin_memory", "fastq device", "DataLoader pin_memory"]
)
@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_gpu_step(
    benchmark: Any, workload: str, loader_kind: str, loader_workers: int
) -> None:
    _, batch, batches, _ = WORKLOADS[workload]
    benchmark.group = f"GPU step {workload}"
    device = torch.device("cuda", torch.cuda.current_device())
    if loader_kind == "fastq pin_memory":
        loader: Any = fastq_loader(workload, loader_workers, pin_memory=True)
    elif loader_kind == "fastq device":
        loader = fastq_loader(workload, loader_workers, device=device)
    else:
        loader = torch_loader(workload, loader_workers, pin_memory=True)
    try:
        run(
            benchmark,
            loader,
            make_step(workload, device),
            batch * batches,
            sync=torch.cuda.synchronize,
        )
    finally:
        close(loader)
