"""fastq itself, with each kind of source, all defaults but workers and slots."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import fastq

from .transports import Case, Feed
from .workloads import BatchSource, FillDataset, SampleDataset, SampleStream


def _endless(pf: Any) -> Iterator[Any]:
    while True:
        yield from pf


def _open(case: Case, source: Any, batch_size: int | None, **kw: Any) -> Any:
    if kw.get("worker_method") != "thread":
        kw["start_method"] = case.start_method
    return fastq.Prefetcher(
        source,
        batch_size=batch_size,
        workers=case.workers,
        slots=case.slots,
        **kw,
    )


@contextmanager
def batches(case: Case) -> Iterator[Feed]:
    """Callable source: each yielded batch is copied into its slot before
    the generator resumes, so the producer reuses one buffer."""
    src = BatchSource(case.producer())
    with _open(case, src, None) as pf:
        yield Feed(_endless(pf), pf.stats)


@contextmanager
def samples(case: Case) -> Iterator[Feed]:
    src = SampleDataset(case.producer())
    with _open(case, src, case.shape.rows) as pf:
        yield Feed(_endless(pf), pf.stats)


@contextmanager
def sample_stream(case: Case) -> Iterator[Feed]:
    """Stream source with batch_size: each yielded sample written into its
    row, as a map-style source's are."""
    src = SampleStream(case.producer())
    with _open(case, src, case.shape.rows) as pf:
        yield Feed(_endless(pf), pf.stats)


@contextmanager
def samples_in_threads(case: Case) -> Iterator[Feed]:
    src = SampleDataset(case.producer())
    with _open(case, src, case.shape.rows, worker_method="thread") as pf:
        yield Feed(_endless(pf), pf.stats)


@contextmanager
def fill(case: Case) -> Iterator[Feed]:
    src = FillDataset(case.producer())
    with _open(case, src, case.shape.rows) as pf:
        yield Feed(_endless(pf), pf.stats)
