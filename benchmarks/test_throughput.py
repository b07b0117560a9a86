"""Steady-state batches/s and GB/s delivered to the consumer, for every
transport, shape and worker count (warm-up excluded; the median round is the
rate reported in extra_info and in the summary)."""

from __future__ import annotations

from typing import Any

from conftest import measure_blocks, skip_if_missing

from fastq._bench.measure import Budget
from fastq._bench.transports import Case


def test_throughput(
    benchmark: Any,
    record: Any,
    transport: str,
    shape: str,
    workers: int,
    slots: int | None,
    budget: Budget,
) -> None:
    skip_if_missing(transport)
    benchmark.group = f"throughput {shape}, {workers} worker(s)"
    case = Case(transport, shape, workers, slots or 2 * workers)
    record("throughput", measure_blocks(benchmark, case, budget))
