"""faster-fifo: a peer shared-memory queue (a circular buffer guarded by a
process-shared mutex); messages are pickled in and unpickled out."""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from faster_fifo import Queue  # type: ignore[import-not-found]

from .transports import Case, Feed
from .workloads import BatchSource

# Pickle framing around a batch's bytes, generously.
_OVERHEAD = 64 << 10


def _producer(source: BatchSource, queue: Any) -> None:
    for batch in source():
        while True:
            try:
                queue.put(batch, timeout=1.0)
                break
            except Exception:  # queue.Full after the timeout: try again
                if queue.is_closed():
                    return


def _gets(queue: Any) -> Iterator[Any]:
    while True:
        yield queue.get(timeout=60.0)


@contextmanager
def queue(case: Case) -> Iterator[Feed]:
    ctx: Any = mp.get_context(case.start_method)
    # Room for `slots` batches: the same number in flight as the others.
    q = Queue(max_size_bytes=case.slots * (case.shape.batch_bytes + _OVERHEAD))
    # put() pickles before it returns: the producer reuses one buffer.
    cfg = case.producer()
    procs = [
        ctx.Process(target=_producer, args=(BatchSource(cfg, w), q), daemon=True)
        for w in range(case.workers)
    ]
    try:
        for p in procs:
            p.start()
        yield Feed(_gets(q))
    finally:
        q.close()
        for p in procs:
            if p.pid is not None:
                p.kill()
                p.join()
