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

from fastq._bench import decode_model, gpu_timeline
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


# The model's calibration: today's input-bound figures on the H200 must
# come out of it before its GPU-decode rows are believed. Its fractions of
# the ceiling may stray this far outside the recorded range (0.41-0.52,
# decode_model.H200_FRACTIONS): the model holds every loader to the
# workers' rate, so DataLoader's own CPU cost (its lowest figures) is not
# in it.
CALIBRATION_TOLERANCE = 0.05


def test_the_closed_form_reproduces_the_h200_input_bound_fractions() -> None:
    low, high = decode_model.H200_FRACTIONS
    today = decode_model.predict_today("resnet18")
    assert today.bound_by == "workers"
    assert (
        low - CALIBRATION_TOLERANCE <= today.of_ceiling <= high + CALIBRATION_TOLERANCE
    )
    assert decode_model.predict_today("resnet50").bound_by == "GPU compute"


def test_every_gpu_decode_row_is_bounded_by_the_engine_and_the_ceiling() -> None:
    for p in decode_model.predictions():
        if p.engine_images_per_s is None:
            continue
        engine_bound = p.engine_images_per_s / (1 - decode_model.OTHER_SHARE)
        assert p.images_per_s <= engine_bound * (1 + 1e-9), p
        assert p.of_ceiling <= 1.0, p
    slow = decode_model.predict_gpu_decode(
        "resnet18", decode_model.BACKENDS["nvImageCodec"], engine_images_per_s=1000
    )
    assert slow.bound_by == "decode engine"


def test_the_stage_on_its_own_thread_leaves_the_loop_its_launches() -> None:
    """With the stage on a thread of its own, the loop's thread costs a
    step its launches and the hand-out alone, whatever the backend or
    where the Pillow files are decoded, and no row is bound by it; the
    blocking backend's decode and the Pillow files cost the stage's
    thread instead."""
    for p in decode_model.predictions():
        if p.engine_images_per_s is None or "loop thread (before)" in p.row:
            continue
        launch_ms = decode_model.h200_step_ms(p.model)[1]
        hand_out_ms = decode_model.HAND_OUT_US_PER_BATCH / 1e3
        assert p.costs_ms["loop thread"] == pytest.approx(launch_ms + hand_out_ms)
        assert p.bound_by != "loop thread", p
    tv = decode_model.BACKENDS["torchvision"]
    nv = decode_model.BACKENDS["nvImageCodec"]
    own = decode_model.predict_gpu_decode("resnet18", tv)
    before = decode_model.predict_gpu_decode(
        "resnet18", tv, stage=decode_model.LOOP_THREAD
    )
    assert own.images_per_s > before.images_per_s
    pillow = decode_model.predict_gpu_decode(
        "resnet18", nv, fallback=decode_model.STAGE_THREAD
    )
    assert pillow.costs_ms["stage thread"] > own.costs_ms["stage thread"] / 2


@pytest.mark.torch
def test_the_timelines_blocking_backend_never_blocks_the_loop() -> None:
    """torchvision's call waits for its decode: on the stage's thread, so
    the loop's thread never waits for the GPU."""
    pytest.importorskip("torch")
    cfg = gpu_timeline.Config(
        "GPU decode: torchvision", "resnet18", image_size=16, steps=30, warmup=10
    )
    run = gpu_timeline.run_once(cfg, timeout_s=100)
    assert run.error is None and run.bad_batches == 0
    assert run.loop_gpu_waits == 0


@pytest.mark.torch
def test_the_timeline_reproduces_the_h200_input_bound_fraction() -> None:
    """fastq.torch.DataLoader on the calibrated model, ResNet-18's step,
    15 workers at the H200 host's rate: input-bound, at the fraction of
    the ceiling the H200 measured."""
    pytest.importorskip("torch")
    cfg = gpu_timeline.Config(
        "fastq.torch.DataLoader", "resnet18", image_size=16, steps=60, warmup=40
    )
    run = gpu_timeline.run_once(cfg, timeout_s=100)
    assert run.error is None and run.bad_batches == 0
    fraction = run.images_per_s / decode_model.ceiling("resnet18")
    low, high = decode_model.H200_FRACTIONS
    assert low - CALIBRATION_TOLERANCE <= fraction <= high + CALIBRATION_TOLERANCE


@pytest.mark.torch
def test_the_timelines_gpu_decode_row_is_bounded_by_the_engines_rate() -> None:
    """An engine far slower than the step: the loop runs at the engine's
    rate (for the files it decodes) and no faster, and the engine is what
    is busy."""
    pytest.importorskip("torch")
    rate = 2000.0
    cfg = gpu_timeline.Config(
        "GPU decode: nvImageCodec",
        "resnet18",
        image_size=16,
        workers=4,
        steps=30,
        warmup=10,
        decode_images_per_s=rate,
    )
    run = gpu_timeline.run_once(cfg, timeout_s=100)
    assert run.error is None and run.bad_batches == 0
    per_batch = round(cfg.batch_size * (1 - decode_model.OTHER_SHARE))
    assert run.images_per_s <= rate * cfg.batch_size / per_batch * 1.001
    assert run.engine_busy > 0.8
    assert run.loop_gpu_waits == 0, "a stream-taking backend never blocks the loop"
