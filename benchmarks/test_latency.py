"""Hand-over latency of small batches: the producer makes one every
millisecond (so the consumer is always waiting), and each batch carries the
time it was made; extra_info holds the percentiles in microseconds."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import measure_blocks, skip_if_missing

from fastq._bench import cases
from fastq._bench.measure import Budget


def test_handover_latency(
    benchmark: Any, record: Any, transport: str, slots: int | None, budget: Budget
) -> None:
    skip_if_missing(transport)
    found = cases.latency([transport], slots)
    if not found:
        pytest.skip(f"{transport}: not a hand-over")
    benchmark.group = "latency, paced small batches"
    record("latency", measure_blocks(benchmark, found[0], budget))
