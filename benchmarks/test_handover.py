"""The consumer's own cost per batch: each next() timed alone while the
producer is a deep ring's worth ahead, so every call finds its batch
waiting (small and medium shapes); extra_info holds the median and p90 in
microseconds."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import skip_if_missing

from fastq._bench import cases
from fastq._bench.measure import Budget, Options, started


@pytest.mark.parametrize("shape", cases.HANDOVER_WORKLOADS)
def test_consumer_cost_per_batch(
    benchmark: Any,
    record: Any,
    transport: str,
    shape: str,
    slots: int | None,
    budget: Budget,
) -> None:
    skip_if_missing(transport)
    found = [c for c in cases.handover([transport], slots) if c.workload == shape]
    if not found:
        pytest.skip(f"{transport}: not a hand-over")
    benchmark.group = f"consumer cost per batch, {shape}"
    with started(found[0], Options(drain=True)) as meter:
        per_block = meter.warm_up(budget)
        rate = per_block * budget.blocks / budget.seconds
        benchmark.pedantic(meter.drain, args=(budget, rate), rounds=1, iterations=1)
        benchmark.extra_info["next_us"] = meter.result.next_us
        record("handover", meter.result)
