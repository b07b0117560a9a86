"""Total memory (PSS of the consumer and every process it started) at
steady state, each case in a fresh interpreter so that no case pays for
another's imports; the round time is the whole isolated run."""

from __future__ import annotations

from typing import Any

from conftest import skip_if_missing

from fastq._bench.isolated import run_isolated
from fastq._bench.measure import Budget, Options
from fastq._bench.transports import Case

MEMORY_SHAPE = "imagenet"


def test_memory_pss(
    benchmark: Any, record: Any, transport: str, workers: int, slots: int | None
) -> None:
    skip_if_missing(transport)
    case = Case(transport, MEMORY_SHAPE, workers, slots or 2 * workers)
    benchmark.group = f"memory {MEMORY_SHAPE}, {workers} worker(s)"
    result = benchmark.pedantic(
        run_isolated, args=(case, Budget(1.0), Options()), rounds=1
    )
    assert result.error is None, result.error
    record("memory", result)
