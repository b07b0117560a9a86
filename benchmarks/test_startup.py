"""Time from construction to the first batch in hand, ImageNet-like batches,
start method spawn; and, with torch imported by the script, first batch and
worker memory per start method beside DataLoader. Each round is a fresh
interpreter (a cold start, and no round inherits another's loader); the
first-batch time is measured inside it and reported in extra_info and the
summary, while the round time that pytest-benchmark shows is the whole
isolated run."""

from __future__ import annotations

import importlib.util
import statistics
from typing import Any

import pytest
from conftest import skip_if_missing

from fastq._bench import cases, torch_startup
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


@pytest.mark.parametrize("workers", torch_startup.WORKERS)
@pytest.mark.parametrize(
    "loader, method",
    torch_startup.CONFIGS,
    ids=[f"{a}-{b}" for a, b in torch_startup.CONFIGS],
)
def test_first_batch_torch_imported(
    benchmark: Any, loader: str, method: str, workers: int
) -> None:
    """`python -m fastq bench --case torch-startup` gives the same runs as
    one table, with ratios to fastq's fork."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    benchmark.group = f"first batch, torch imported, {workers} worker(s)"
    runs: list[torch_startup.Run] = []

    def first_batch() -> None:
        runs.append(torch_startup.run_once(loader, method, workers))

    benchmark.pedantic(first_batch, rounds=torch_startup.REPEATS)
    errors = [r.error for r in runs if r.error]
    assert not errors, errors[0]
    benchmark.extra_info.update(
        start_method=sorted({r.actual for r in runs}),
        first_batch_s=round(statistics.median(r.first_batch_s for r in runs), 3),
        first_batch_runs_s=[round(r.first_batch_s, 3) for r in runs],
        worker_pss_mb=round(
            statistics.median(statistics.mean(r.worker_pss) for r in runs) / 1e6, 1
        ),
        server_pss_mb=round(statistics.median(r.server_pss for r in runs) / 1e6, 1),
        total_pss_mb=round(statistics.median(r.total_pss for r in runs) / 1e6, 1),
    )
