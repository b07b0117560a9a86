"""SPDL 0.8: its thread pipeline (a pipe stage makes each batch, handed on by
reference), and iterate_in_subprocess with a SharedMemorySegmentPool arena
(the producer copies each batch into a preallocated shared segment, which the
consumer reads in place)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

# spdl ships its types; the ignore is for checking where it is not installed.
from spdl.pipeline import (  # type: ignore[import-not-found, unused-ignore]
    PipelineBuilder,
    SharedMemorySegmentPool,
    iterate_in_subprocess,
)

from .transports import Case, Feed
from .workloads import Arrays, BatchSource, ThreadBatches

# spdl aligns each offloaded array to 64 bytes within a segment.
_ALIGNMENT = 64
# Queues between a pipe stage and the sink hold this many items (spdl's own
# constant, _components/_node.py: buffer_size=2 for every queue but the sink).
_STAGE_QUEUE = 2


@contextmanager
def threads(case: Case) -> Iterator[Feed]:
    """Source: batch numbers; one pipe stage with `workers` concurrent calls
    makes batch n; the sink buffers `slots` batches. Batches stay where the
    producer made them: the consumer is handed the producer's own buffer."""
    # Batches alive at once: in the stage (running and queued for it), in
    # its output queue, in the sink, in the consumer's hands.
    holds = 2 * case.workers + _STAGE_QUEUE + case.slots + 1
    make = ThreadBatches(case.producer(holds))
    pipeline = (
        PipelineBuilder[int, Arrays]()
        .add_source(itertools.count())
        # mypy cannot pick a member of pipe()'s union of operation types.
        .pipe(make, concurrency=case.workers)  # type: ignore[arg-type, unused-ignore]
        .add_sink(case.slots)
        .build(num_threads=case.workers)
    )
    with pipeline.auto_stop(timeout=30.0):
        yield Feed(iter(pipeline.get_iterator(timeout=60.0)))


def _round_robin(feeds: list[Iterator[Any]]) -> Iterator[Any]:
    for it in itertools.cycle(feeds):
        yield next(it)


@contextmanager
def segment_pool(case: Case) -> Iterator[Feed]:
    """One iterate_in_subprocess per worker, each with its own pool of
    shared segments (as many as fastq's ring has slots, split between the
    workers), taken from in turn. The producer copies each batch into a free
    segment; the consumer gets arrays over that segment, which returns to the
    pool once they are garbage."""
    fields = len(case.shape.fields)
    segment = case.shape.batch_bytes + fields * _ALIGNMENT
    per_worker = max(1, case.slots // case.workers)
    with ExitStack() as stack:
        feeds = []
        for w in range(case.workers):
            pool = SharedMemorySegmentPool(
                segment, per_worker + 1, acquire_timeout=60.0
            )
            # The returned iterable owns the pool (closes and unlinks it).
            source = iterate_in_subprocess(
                BatchSource(case.producer(), w),
                buffer_size=per_worker,
                mp_context=case.start_method,
                timeout=60.0,
                arena=pool,
            )
            # What its finalizer does at garbage collection, done on leaving.
            stack.callback(source._shutdown)  # type: ignore[attr-defined, unused-ignore]
            feeds.append(iter(source))
        yield Feed(_round_robin(feeds), notes=[f"{per_worker + 1} segments/worker"])
