"""The GPU-timeline model: the simulation behind `python -m fastq bench
--case gpu-model` (fastq/_bench/gpu_timeline.py on event_sim.py) counts
what limits a GPU-decoding loop, in simulated time (nothing here depends on
the load of the machine running it); and the torch stand-in
(fastq/_bench/gpu_model.py) keeps its timeline, launch queue, events,
allocator and copies as it promises."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from fastq._bench import decode_model as dm
from fastq._bench import gpu_model_case as case
from fastq._bench import gpu_timeline as gt
from fastq._bench.event_sim import Queue, Resource, Simulation
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
    assert "MainThread launch" not in gpu.waits, "the queue's items launch at once"
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
@pytest.mark.slow  # a fresh interpreter importing torch: seconds
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


# ------------------------------------------------ the simulation kernel


def test_a_resource_serves_its_units_in_the_order_they_were_asked() -> None:
    sim = Simulation()
    cores = Resource(sim, "cores", 2)
    ends: list[tuple[str, float]] = []

    def job(name: str) -> object:
        yield from cores.hold(1.0)
        ends.append((name, sim.now))

    for name in "abc":
        sim.process(job(name))
    sim.run()
    assert ends == [("a", 1.0), ("b", 1.0), ("c", 2.0)], "c waits for a unit"
    assert cores.held_s() == pytest.approx(3.0)


def test_a_full_queue_holds_its_putter_until_an_item_is_taken() -> None:
    sim = Simulation()
    q = Queue(sim, 1)
    put_at: list[float] = []

    def producer() -> object:
        for i in range(2):
            yield q.put(i)
            put_at.append(sim.now)

    def consumer() -> object:
        yield sim.timeout(5.0)
        assert (yield q.get()) == 0
        assert (yield q.get()) == 1

    sim.process(producer())
    sim.run(sim.process(consumer()))
    assert put_at == [0.0, 5.0]


# ------------------------------------------------- the simulated loop

FAST = {"steps": 60, "warmup": 20}


def _row(stage: dm.Stage, rate: float) -> gt.Row:
    return gt.Row("resnet18", gt.GPU_DECODE, stage, rate, **FAST)


def test_a_run_is_the_same_every_time() -> None:
    row = _row(dm.Stage("batched", worker_share=0.3), 7000.0)
    a, b = gt.simulate(row), gt.simulate(row)
    assert a.images_per_s == b.images_per_s and a.busy == b.busy


def test_the_gil_caps_the_loop_when_step_and_stage_want_more_than_a_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Loop CPU (5.6 ms a step) and the stage's host work both hold the GIL:
    at 80 us an image they want more than 1 s a second at the step's rate,
    so the rate stops at 1 / (the GIL's seconds per image), far below what
    the engines (1e6/s) and the SMs allow. Work that let go of the GIL
    (a sleep) would not stop there."""
    monkeypatch.setattr(dm, "OTHER_SHARE", 0.0)  # the GIL alone in the way
    host_us = 80.0
    stage = dm.Stage("slow host", host_us=host_us, decoders=2, submit_us=0.0)
    loop_s = dm.step_cpu_ms("resnet18") / 1e3 + dm.HAND_OUT_US_PER_BATCH / 1e6
    gil_per_image = loop_s / dm.BATCH + host_us / 1e6
    assert dm.ceiling("resnet18") * gil_per_image > 1.2, "more than 1 s a second"
    capped = gt.simulate(_row(stage, 1e6))
    # 1% for the span's edges: the loop runs up to five steps ahead of the GPU.
    assert 0.9 / gil_per_image <= capped.images_per_s <= 1.01 / gil_per_image
    assert capped.busy["GIL"] >= 0.95 and capped.bound_by == "GIL"
    free = gt.simulate(_row(stage.but(host_us=10.0), 1e6))
    assert free.images_per_s > 1 / gil_per_image, "a light stage is not capped"


def test_one_decoders_submit_gap_idles_the_engines_and_two_remove_it() -> None:
    """With one Decoder the next batch is submitted only once the last is
    decoded: each batch costs the engines its submit time more. Two
    Decoders in turn submit while the other's batch is on the engines."""
    rate = 4000.0
    submit_us = 40.0
    hardware = dm.BATCH * (1 - dm.OTHER_SHARE)
    one = dm.Stage("one", submit_us=submit_us, cpu_threads=64)
    serial = gt.simulate(_row(one, rate))
    cycle_s = hardware / rate + hardware * submit_us / 1e6
    assert serial.images_per_s <= dm.BATCH / cycle_s * 1.001
    assert serial.engine_idle_ms_per_batch >= 0.9 * hardware * submit_us / 1e3
    two = gt.simulate(_row(one.but(decoders=2), rate))
    assert two.busy["JPEG engines"] >= 0.97 and two.bound_by == "JPEG engines"
    assert two.images_per_s > serial.images_per_s * 1.05
    no_gap = gt.simulate(_row(one.but(submit_us=0.0), rate))
    assert no_gap.images_per_s > serial.images_per_s * 1.05


def test_files_are_decoded_where_the_code_decodes_them() -> None:
    """nvImageCodec: the files the engines do not take go to its CPU
    threads inside the call, so the workers only read and parse.
    torchvision: they are decoded with Pillow on the stage's thread."""
    nv = gt.simulate(_row(dm.Stage("nv"), 10_900.0))
    tv = gt.simulate(_row(dm.Stage("tv", backend="torchvision"), 10_900.0))
    assert nv.extra["stage thread"]["waits for the CPU threads"] > 0
    assert "Pillow" not in nv.extra["stage thread"]
    assert tv.extra["stage thread"]["Pillow"] > 0.1
    encoded_only = nv.images_per_s * dm.ENCODED_US_PER_IMAGE / 1e6 / dm.WORKERS
    assert nv.busy["workers"] == pytest.approx(encoded_only, rel=0.05)
    assert tv.images_per_s < nv.images_per_s


def test_a_slow_engine_bounds_the_row_at_its_rate() -> None:
    rate = 2000.0
    r = gt.simulate(_row(dm.Stage("slow", decoders=2), rate))
    assert r.images_per_s <= rate / (1 - dm.OTHER_SHARE) * 1.001
    assert r.bound_by == "JPEG engines"


def test_the_workers_share_adds_to_the_engines_capacity() -> None:
    two = dm.Stage("two", decoders=2)
    alone = gt.simulate(_row(two, 7000.0))
    share = dm.balanced_worker_share(7000.0)
    assert 0.0 < share < 1.0
    shared = gt.simulate(_row(two.but(worker_share=share), 7000.0))
    assert shared.images_per_s > alone.images_per_s * 1.2
    assert shared.busy["workers"] > 3 * alone.busy["workers"]


# ------------------------------------------ calibration and acceptance


def _today() -> list[gt.Result]:
    return [
        gt.simulate(gt.Row("resnet18", loader, **FAST)) for loader in gt.CPU_LOADERS
    ]


def test_todays_loaders_land_in_the_h200s_measured_range() -> None:
    """From the workers' measured CPU per image alone (never the figures
    they are checked against), each loader lands in its own measured
    range on the H200, give or take the tolerance, bound by the workers."""
    for r in _today():
        assert case.calibrated(r), (r.row.loader, r.of_ceiling)
        assert r.bound_by == "workers"
    assert dm.CALIBRATION_TOLERANCE < 0.05


def test_the_calibration_fails_on_a_host_15_percent_slower(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The check can fail: with the compute case's Xeon-to-AMD ratio (1.15)
    in place of 1, DataLoader's and fastq's rows fall out of range."""
    monkeypatch.setattr(dm, "XEON_OVER_AMD", 72.7 / 63.0)
    assert not any(case.calibrated(r) for r in _today())


def test_the_shipped_row_reaches_nine_tenths_of_the_ceiling_at_7000() -> None:
    """`--engine-rate 7000`: the shipped row at >= 0.90 of ResNet-18's
    ceiling, the code as it is today well below it."""
    rows = [
        r
        for r in case.plan([7000.0])
        if r.stage is not None and r.stage.name.startswith((case.SHIPPED, "today's"))
    ]
    results = {r.stage.name: gt.simulate(r) for r in rows if r.stage is not None}
    shipped = [v for k, v in results.items() if k.startswith(case.SHIPPED)]
    assert len(shipped) == 1 and shipped[0].of_ceiling >= 0.90
    today = [v for k, v in results.items() if k.startswith("today's")]
    assert today and all(r.of_ceiling < 0.75 for r in today)


def test_the_bench_case_prints_the_rows_at_the_rate_asked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from fastq._bench.runner import main

    assert main(["--case", "gpu-model", "--engine-rate", "7000"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| resnet18 |")]
    assert any("shipped" in line and "| 7,000 |" in line for line in rows)
    assert not any("10,900" in line for line in rows)
    assert "within" in out and "OUTSIDE" not in out


def test_an_engine_rate_that_is_not_positive_is_refused() -> None:
    from fastq._bench.runner import main

    with pytest.raises(SystemExit, match="--engine-rate 0: give a positive"):
        main(["--case", "gpu-model", "--engine-rate", "0"])


def test_no_row_passes_what_any_one_resource_allows() -> None:
    """Each resource's closed-form capacity (its seconds per image, from
    the same inputs) bounds every row of the case: a resource the
    simulation forgot to hold would let a row through."""
    for row in case.plan([7000.0, 10_900.0]):
        short = gt.Row(row.model, row.loader, row.stage, row.engine_rate, **FAST)
        r = gt.simulate(short)
        caps = gt.capacities(short)
        # 1% for the span's edges: the loop runs ahead of the GPU.
        assert r.images_per_s <= min(caps.values()) * 1.01, (row.name, caps)
