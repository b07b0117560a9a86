"""The GPU-timeline model (fastq/_bench/gpu_model.py) that the gpu-model
bench measures the pinned path on: its timeline, launch queue, events,
allocator and copies behave as the model promises, and the bench case runs
each loader on it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from fastq._bench import gpu_timeline
from fastq._bench.gpu_model import COPY_BYTES_PER_S, ModelEvent, ModelGpu

pytestmark = pytest.mark.timeout(120)


def test_an_event_completes_when_the_gpu_passes_the_work_before_it() -> None:
    gpu = ModelGpu(launch_queue=8)
    gpu.launch(gpu.default, 0.2)
    event = ModelEvent(gpu)
    event.record()
    assert not event.query()
    t0 = time.perf_counter()
    event.synchronize()
    assert event.query()
    assert time.perf_counter() - t0 >= 0.15
    assert gpu.waits["MainThread sync"][0] == 1
    assert ModelEvent(gpu).query(), "an event never recorded is complete"


def test_streams_run_side_by_side_and_wait_for_events() -> None:
    gpu = ModelGpu(launch_queue=8)
    side = gpu.new_stream()
    gpu.launch(side, 0.3)
    copied = side.record_event()
    gpu.default.wait_event(copied)
    gpu.launch(gpu.default, 0.1)
    # The default stream's work starts after the side stream's event.
    assert gpu.default.tail >= copied.at + 0.1 - 1e-9
    other = gpu.new_stream()
    gpu.launch(other, 0.1)
    assert other.tail < copied.at, "a stream that waits for nothing runs at once"


def test_launches_past_the_queue_wait_for_the_gpu() -> None:
    """The loop runs ahead by the launch queue and no further."""
    gpu = ModelGpu(launch_queue=4)
    t0 = time.perf_counter()
    for _ in range(4):
        gpu.launch(gpu.default, 0.05)
    assert time.perf_counter() - t0 < 0.05, "the queue's items launch at once"
    assert "MainThread launch" not in gpu.waits
    gpu.launch(gpu.default, 0.05)
    assert time.perf_counter() - t0 >= 0.04, "the fifth waits for the first to end"
    assert gpu.waits["MainThread launch"][0] == 1


def test_copies_from_pageable_memory_are_staged_by_the_caller() -> None:
    gpu = ModelGpu(launch_queue=8)
    host = np.arange(1 << 20, dtype=np.uint8)
    gpu.copy_to_device(host.ctypes.data, host.nbytes, host)
    assert gpu.staged_bytes == host.nbytes
    ring = np.zeros(1 << 20, dtype=np.uint8)
    gpu.register(ring.ctypes.data, ring.nbytes)
    gpu.copy_to_device(ring.ctypes.data + 4096, 4096, ring[4096:8192])
    assert gpu.staged_bytes == host.nbytes, "registered memory is copied by DMA"
    assert gpu.default.tail - time.perf_counter() <= 2 * host.nbytes / COPY_BYTES_PER_S


def test_a_host_block_is_reused_only_after_its_copies_have_run() -> None:
    """As torch's caching host allocator: a pinned block freed while a
    copy from it is queued is not handed out again until that copy ran."""
    gpu = ModelGpu(launch_queue=8)
    gpu.launch(gpu.default, 0.3)  # the copy queues behind this
    block = gpu.host_empty(1 << 16)
    gpu.copy_to_device(block.ctypes.data, block.nbytes, block)
    first = block.ctypes.data
    del block
    again = gpu.host_empty(1 << 16)
    second = again.ctypes.data
    assert second != first, "reused under a queued copy"
    gpu.synchronize()
    del again
    assert gpu.host_empty(1 << 16).ctypes.data in {first, second}
    assert gpu.host_bytes == 2 << 16, "no third block once the copy ran"


@pytest.mark.torch
def test_seeding_torch_on_the_model_leaves_a_cuda_build_alone() -> None:
    """On a CUDA build, torch.cuda's device count comes from the driver
    while its generators were never made: seeding (as every worker does)
    must not reach them. Here a CPU build is made to count one device."""
    pytest.importorskip("torch")
    script = textwrap.dedent(
        """
        import torch, torch.cuda.random
        from fastq._bench.gpu_model import install
        torch.cuda.random.device_count = lambda: 1
        install(1024)
        torch.manual_seed(1)
        torch.seed()
        print("seeded")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "seeded"


@pytest.mark.torch
@pytest.mark.parametrize("loader", ["DataLoader", "fastq.torch.DataLoader"])
def test_the_bench_case_runs_each_loader_on_the_model(loader: str) -> None:
    """A short run in a fresh interpreter, as `--case gpu-model` runs it:
    the right batches, and fastq's pinned ring never made the loop's thread
    wait for the GPU."""
    pytest.importorskip("torch")
    cfg = gpu_timeline.Config(
        loader,
        "resnet18",
        batch_size=16,
        image_size=32,
        workers=2,
        images_per_s=4000.0,
        steps=20,
        warmup=10,
    )
    run = gpu_timeline.run_once(cfg, timeout_s=100)
    assert run.error is None
    assert run.bad_batches == 0 and run.images_per_s > 0
    assert run.loop_gpu_waits == 0
    if loader == "DataLoader":
        assert run.host_bytes > 0, "DataLoader's pin thread copies into blocks"
    else:
        assert run.pinned is not None and run.pinned["loop_synchronizes"] == 0
        assert run.pinned["registered"] and run.host_bytes == 0
