"""Compute-bound workloads: workers do real per-sample work (numpy
augmentation; zlib inflating images, which lets go of the GIL), so the
best a loader can do is stay out of the way; extra_info has the ratio to
the ideal (workers x this process's own batch rate)."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import measure_blocks, skip_if_missing

from fastq._bench import cases
from fastq._bench.measure import Budget


@pytest.mark.parametrize("workload", ["compute", "decode"])
def test_compute_bound(
    benchmark: Any,
    workload: str,
    record: Any,
    transport: str,
    workers: int,
    slots: int | None,
    budget: Budget,
) -> None:
    skip_if_missing(transport, compute_bound=True)
    found = cases.compute([transport], [workers], slots, workload)
    if not found:
        pytest.skip(f"{transport}: no workers to compute in")
    benchmark.group = f"compute-bound ({workload}), {workers} worker(s)"
    result = measure_blocks(benchmark, found[0], budget)
    ran = found[0].workers  # workers="auto": the most it can run
    ideal = cases.compute_ideal([ran], workload)[ran]
    benchmark.extra_info["ideal_batches_per_s"] = round(ideal, 2)
    benchmark.extra_info["x_ideal"] = round(result.batches_per_s / ideal, 3)
    record(workload, result)
