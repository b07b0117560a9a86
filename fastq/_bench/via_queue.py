"""The pickled multiprocessing.Queue, as Keras' GeneratorEnqueuer uses it
(workers put numpy batches; the seed's get_batch polls empty() and sleeps
10 ms), and in its strongest form (the consumer blocks in get())."""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .transports import Case, Feed
from .workloads import BatchSource

# The seed's get_batch uses max_queue_size=64; capped so that the batches in
# flight stay under this many bytes (64 huge batches would be 10 GB).
SEED_QUEUE_SIZE = 64
SEED_QUEUE_BYTES = 256 << 20
SEED_SLEEP_S = 0.01


def _enqueuer_task(source: BatchSource, queue: Any, stop: Any) -> None:
    """GeneratorEnqueuer.data_generator_task with use_multiprocessing=True."""
    batches = source()
    while not stop.is_set():
        queue.put(next(batches))


@contextmanager
def _enqueuer(case: Case, maxsize: int) -> Iterator[tuple[Any, Any]]:
    # GeneratorEnqueuer starts multiprocessing.Process: the default context.
    ctx: Any = mp.get_context(case.start_method)
    queue = ctx.Queue(maxsize=maxsize)
    stop = ctx.Event()
    cfg = case.producer(maxsize)
    procs = [
        ctx.Process(
            target=_enqueuer_task, args=(BatchSource(cfg, w), queue, stop), daemon=True
        )
        for w in range(case.workers)
    ]
    try:
        for p in procs:
            p.start()
        yield queue, stop
    finally:
        stop.set()
        for p in procs:  # GeneratorEnqueuer.stop terminates them
            if p.pid is not None:
                p.kill()
                p.join()
        queue.close()
        queue.cancel_join_thread()


def seed_queue_size(case: Case) -> int:
    return max(
        case.slots, min(SEED_QUEUE_SIZE, SEED_QUEUE_BYTES // case.shape.batch_bytes)
    )


def _get_batch(queue: Any, stop: Any) -> Iterator[Any]:
    """The seed's get_batch loop, verbatim in spirit."""
    while True:
        out = None
        while not stop.is_set():
            if not queue.empty():
                out = queue.get()
                break
            time.sleep(SEED_SLEEP_S)
        yield out


@contextmanager
def seed(case: Case) -> Iterator[Feed]:
    size = seed_queue_size(case)
    with _enqueuer(case, size) as (queue, stop):
        yield Feed(_get_batch(queue, stop), notes=[f"maxsize={size}"])


@contextmanager
def blocking(case: Case) -> Iterator[Feed]:
    with _enqueuer(case, case.slots) as (queue, _):
        yield Feed(iter(queue.get, None), notes=[f"maxsize={case.slots}"])
