"""examples/get_batch.py, the seed's get_batch(num_workers, batch_size)
program on fastq: it runs to its end with process and thread workers,
delivers batches of the promised shape, each worker's images its own, and
leaves no process or shared memory behind."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from tagged_runs import launch

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "get_batch.py"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", ["process", "thread"])
def test_the_get_batch_example_runs_with_either_worker_method(
    tmp_path: Path, method: str
) -> None:
    out = launch(
        [sys.executable, str(EXAMPLE), "--method", method, "--batches", "12"],
        tmp_path,
        timeout=50,
    )
    assert "images (128, 64, 64, 3) uint8, labels (128,) int64" in out
    assert f"12 batches from 2 {method} workers" in out
    assert "distinct first images: 12 of 12" in out
