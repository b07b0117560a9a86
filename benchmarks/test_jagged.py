"""Variable-length samples under pytest-benchmark: the time per batch of
fastq's jagged field against the same samples padded to their bound (the
side-by-side run with the pickled queue and memcpy is
benchmarks/jagged_vs_padded.py)."""

from __future__ import annotations

from typing import Any

import pytest
from jagged_vs_padded import (
    BATCH,
    MAX_LEN,
    Jagged,
    Padded,
    endless,
    touch_jagged,
    touch_padded,
)

import fastq


@pytest.mark.parametrize("layout", ["jagged", "padded"])
def test_time_per_batch(benchmark: Any, layout: str) -> None:
    if layout == "jagged":
        source: Any = Jagged()
        spec: Any = (fastq.Jagged("float32", max_len=MAX_LEN), ((), "int64"))
        touch = touch_jagged
    else:
        source, spec, touch = Padded(), None, touch_padded
    benchmark.group = f"variable-length samples, {BATCH} a batch"
    with fastq.Prefetcher(source, batch_size=BATCH, workers=1, spec=spec) as pf:
        batches = endless(pf)
        benchmark(lambda: touch(next(batches)))
        benchmark.extra_info["slot_bytes"] = pf.spec.slot_bytes
