"""System calls and page faults per batch at steady state, on both sides,
counted by `perf stat` (skipped where perf cannot count system calls). Each
case runs in a fresh interpreter (the long-spin regime sets FASTQ_SPIN_US
before fastq is imported); the round time is the whole isolated run."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import skip_if_missing

from fastq._bench import cases, procstat
from fastq._bench.isolated import run_isolated
from fastq._bench.measure import Budget


@pytest.mark.parametrize("regime", ["free-running", "long spin"])
@pytest.mark.parametrize("steady_shape", cases.STEADY_WORKLOADS)
def test_steady_state_counters(
    benchmark: Any,
    record: Any,
    transport: str,
    steady_shape: str,
    regime: str,
    slots: int | None,
    budget: Budget,
) -> None:
    skip_if_missing(transport)
    if not procstat.perf_available():
        pytest.skip(
            "perf cannot count raw_syscalls here (install perf, or "
            "lower kernel.perf_event_paranoid)"
        )
    found = [
        (c, o)
        for c, o in cases.steady([transport], slots)
        if c.workload == steady_shape
        and (o.spin_us is None) == (regime == "free-running")
    ]
    if not found:
        pytest.skip(f"{transport}: no {regime} run (one process, or not fastq)")
    case, options = found[0]
    benchmark.group = f"steady state {steady_shape}"
    result = benchmark.pedantic(run_isolated, args=(case, budget, options), rounds=1)
    assert result.error is None, result.error
    record("steady", result)
