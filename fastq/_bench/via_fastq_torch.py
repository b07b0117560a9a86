"""fastq.torch.DataLoader: the one-line migration, with DataLoader's own
arguments (batch_size=rows, default collate, persistent workers) as the
DataLoader transport uses them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastq.torch import DataLoader

from .transports import Case, Feed
from .workloads import SampleDataset


def _epochs(loader: Any) -> Iterator[Any]:
    while True:  # persistent workers carry over from one epoch to the next
        yield from loader


@contextmanager
def samples(case: Case) -> Iterator[Feed]:
    """batch_size=rows: each worker collates samples into its slot."""
    dataset: Any = SampleDataset(case.producer())  # a map-style duck, no Dataset
    loader: DataLoader[Any] = DataLoader(
        dataset,
        batch_size=case.shape.rows,
        num_workers=case.workers,
        persistent_workers=True,
        prefetch_factor=max(1, case.slots // case.workers),
        multiprocessing_context=case.start_method,
        slots=case.slots,
    )
    try:
        yield Feed(_epochs(loader), loader.stats)
    finally:
        loader.close()
