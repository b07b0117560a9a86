"""Time from construction to the first batch in hand, ImageNet-like batches,
start method spawn. Each round is a fresh interpreter (a cold start, and no
round inherits another's loader); the first-batch time is measured inside
it and reported in extra_info and the summary, while the round time that
pytest-benchmark shows is the whole isolated run."""

from __future__ import annotations

import statistics
from typing import Any

import pytest
from conftest import skip_if_missing

from fastq._bench import cases
from fastq._bench.isolated import run_isolated
from fastq._bench.measure import Budget, Options, Result


def test_first_batch_spawn(
    benchmark: Any, record: Any, transport: str, slots: int | None
) -> None:
    skip_if_missing(transport)
    found = cases.startup([transport], slots)
    if not found:
        pytest.skip(f"{transport}: runs in one process, nothing to start")
    case = found[0]
    benchmark.group = "first batch, spawn"
    results: list[Result] = []

    def first_batch() -> None:
        results.append(run_isolated(case, Budget(0.0), Options(first_only=True)))

    benchmark.pedantic(first_batch, rounds=cases.STARTUP_REPEATS)
    errors = [r.error for r in results if r.error]
    assert not errors, errors[0]
    median = statistics.median(r.first_batch_s for r in results)
    result = min(results, key=lambda r: abs(r.first_batch_s - median))
    benchmark.extra_info["first_batch_runs_s"] = [
        round(r.first_batch_s, 3) for r in results
    ]
    record("startup", result)
