"""torchdata 0.11's nodes: ParallelMapper over batch numbers, its map
function making batch n, in threads (batches handed on by reference) or in
processes (batches pickled through a multiprocessing queue)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torchdata.nodes import (  # type: ignore[import-untyped, import-not-found, unused-ignore]
    IterableWrapper,
    Loader,
    ParallelMapper,
)

from .transports import Case, Feed
from .workloads import ThreadBatches


def _max_concurrent(case: Case) -> int | None:
    """ParallelMapper's bound on batches in flight: None (its default,
    2 x workers, as slots is by default) unless slots asks for fewer;
    it refuses a bound above the number of workers."""
    return None if case.slots >= 2 * case.workers else min(case.slots, case.workers)


def _shutdown(mapper: Any) -> None:
    """What the mapper's iterator does when garbage-collected, called now;
    then any worker process still alive (one can block at exit, flushing
    batches into a pipe no one reads any more) is killed."""
    it = getattr(mapper._it, "_it", None)  # ParallelMapper -> impl -> iterator
    if it is None:
        return
    it._shutdown()
    for w in it._workers:
        if getattr(w, "pid", None) is not None and w.is_alive():
            w.kill()
            w.join()


@contextmanager
def _mapped(case: Case, method: str) -> Iterator[Feed]:
    bound = _max_concurrent(case)
    in_flight = bound or 2 * case.workers
    # A process worker's queue pickles in a feeder thread, after put()
    # returns; a thread worker's batch is the consumer's until it takes the
    # next one. Either way the producer must not reuse a buffer still in
    # flight.
    mapper = ParallelMapper(
        IterableWrapper(itertools.count()),
        ThreadBatches(case.producer(in_flight)),
        num_workers=case.workers,
        method=method,
        multiprocessing_context=case.start_method if method == "process" else None,
        max_concurrent=bound,
    )
    loader = Loader(mapper)
    try:
        yield Feed(iter(loader), notes=[f"max_concurrent={in_flight}"])
    finally:
        _shutdown(mapper)


def threads(case: Case) -> Any:
    return _mapped(case, "thread")


def processes(case: Case) -> Any:
    return _mapped(case, "process")
