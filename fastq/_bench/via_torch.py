"""PyTorch's DataLoader with its defaults (default collate, default sharing
strategy, default start method), persistent workers, no pinned memory."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch.utils.data import DataLoader

from .transports import Case, Feed
from .workloads import BatchDataset, SampleDataset


def _loader(case: Case, dataset: Any, batch_size: int | None) -> Any:
    return DataLoader(
        dataset,
        batch_size=batch_size,
        num_workers=case.workers,
        persistent_workers=True,
        pin_memory=False,
        # Its default (2) when slots is the default 2 per worker.
        prefetch_factor=max(1, case.slots // case.workers),
        multiprocessing_context=case.start_method,
    )


def _prefetch(case: Case) -> int:
    return max(1, case.slots // case.workers) * case.workers


def _epochs(loader: Any) -> Iterator[Any]:
    while True:  # persistent workers carry over from one epoch to the next
        yield from loader


@contextmanager
def _feed(loader: Any) -> Iterator[Feed]:
    try:
        yield Feed(_epochs(loader))
    finally:
        # What the iterator's __del__ does; called now so that teardown is
        # not left to the garbage collector.
        if loader._iterator is not None:
            # A spawn worker stopped right after its first batch can die with
            # "terminate called without an active exception", and torch's
            # SIGCHLD handler raises here; its own `finally` has already
            # terminated the rest. Nothing measured is affected.
            with contextlib.suppress(RuntimeError):
                loader._iterator._shutdown_workers()


def samples(case: Case) -> Any:
    """batch_size=rows: each worker collates samples with default_collate."""
    return _feed(_loader(case, SampleDataset(case.producer()), case.shape.rows))


def batches(case: Case) -> Any:
    """batch_size=None: dataset item i is whole batch i. The worker's queue
    pickles it in a feeder thread, so the producer rotates through more
    buffers than the loader has batches in flight."""
    return _feed(_loader(case, BatchDataset(case.producer(_prefetch(case))), None))
