"""fastq itself, with each kind of source, all defaults but workers and slots."""

from __future__ import annotations

import time
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


# workers="auto" has settled once its decisions stay the same this long.
AUTO_SETTLED_S = 2.0
AUTO_SETTLE_MAX_S = 20.0


def _settle(pf: Any, it: Iterator[Any]) -> str:
    """Consumes until workers="auto" stops changing its mind; says when
    and on what it settled."""
    t0 = changed = time.perf_counter()
    last = None
    while True:
        next(it)
        now = time.perf_counter()
        tune = pf.stats()["autotune"]
        if tune["decisions"][-1] != last:
            last, changed = tune["decisions"][-1], now
        if now - changed >= AUTO_SETTLED_S or now - t0 >= AUTO_SETTLE_MAX_S:
            return (
                f"workers='auto' settled on {tune['workers']} of {tune['pool']} "
                f"workers {changed - t0:.1f} s after the first batch: {tune['why']}"
            )


@contextmanager
def samples_auto(case: Case) -> Iterator[Feed]:
    """As `samples`, with workers="auto"; the feed starts once it settled
    (the time that took is in the notes)."""
    src = SampleDataset(case.producer())
    with fastq.Prefetcher(
        src,
        batch_size=case.shape.rows,
        workers="auto",
        slots=case.slots,
        start_method=case.start_method,
    ) as pf:
        it = _endless(pf)
        note = _settle(pf, it)
        yield Feed(it, pf.stats, [note])


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
