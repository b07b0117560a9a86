"""Each transport moves the same batches from producer processes to this
process and reports steady-state throughput (warm-up excluded)."""

from __future__ import annotations

import multiprocessing as mp
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .workloads import BatchSource, SampleDataset, Workload, read_stamp, stamp


MEMCPY = "memcpy (1 process)"
QUEUE = "mp.Queue (pickled)"


@dataclass
class Result:
    transport: str
    batches: int
    seconds: float
    batch_bytes: int
    first_batch_s: float

    @property
    def batches_per_s(self) -> float:
        return self.batches / self.seconds

    @property
    def gb_per_s(self) -> float:
        return self.batches * self.batch_bytes / self.seconds / 1e9

    @property
    def us_per_batch(self) -> float:
        return 1e6 * self.seconds / self.batches


@dataclass
class Budget:
    seconds: float
    warmup: int


def _measure(name: str, workload: Workload, budget: Budget, t_start: float,
             batches: Any, touch: Callable[[Any], None]) -> Result:
    """Consumes `batches` for warm-up, then for budget.seconds."""
    it = iter(batches)
    touch(next(it))
    first = time.perf_counter() - t_start
    for _ in range(budget.warmup):
        touch(next(it))
    n = 0
    t0 = time.perf_counter()
    deadline = t0 + budget.seconds
    while True:
        touch(next(it))
        n += 1
        if n % 8 == 0 and time.perf_counter() >= deadline:
            break
    return Result(name, n, time.perf_counter() - t0, workload.batch_bytes, first)


def _check_first_field(batch: Any) -> None:
    read_stamp(batch[0])


def _memcpy(name: str, workload: Workload, buffers: int, budget: Budget) -> Result:
    src = workload.template(seed=0)
    dst = [tuple(np.empty_like(a) for a in src) for _ in range(buffers)]

    def batches() -> Any:
        n = 0
        while True:
            stamp(src, n)
            out = dst[n % buffers]
            n += 1
            for d, s in zip(out, src):
                np.copyto(d, s)
            yield out

    return _measure(name, workload, budget, time.perf_counter(), batches(),
                    _check_first_field)


def run_memcpy(workload: Workload, workers: int, slots: int, budget: Budget) -> Result:
    """One process copying the same bytes into `slots` destinations in turn:
    the same memory footprint as the ring, so the limit of writing each
    batch once to memory."""
    return _memcpy(MEMCPY, workload, slots, budget)


def run_memcpy_hot(workload: Workload, workers: int, slots: int,
                   budget: Budget) -> Result:
    """The same copy into one destination, which stays in a large last-level
    cache: an upper bound no transport with several batches in flight meets."""
    return _memcpy("memcpy (1 buffer, hot)", workload, 1, budget)


def run_fastq_batches(workload: Workload, workers: int, slots: int,
                      budget: Budget) -> Result:
    import fastq

    t = time.perf_counter()
    with fastq.Prefetcher(BatchSource(workload), workers=workers, slots=slots,
                          ordered=False) as pf:
        return _measure("fastq (whole batches)", workload, budget, t,
                        _endless(pf), _check_first_field)


def run_fastq_samples(workload: Workload, workers: int, slots: int,
                      budget: Budget) -> Result:
    import fastq

    t = time.perf_counter()
    with fastq.Prefetcher(SampleDataset(workload), batch_size=workload.rows,
                          workers=workers, slots=slots, ordered=False) as pf:
        return _measure("fastq (per-sample)", workload, budget, t,
                        _endless(pf), _check_first_field)


def _endless(pf: Any) -> Any:
    while True:
        yield from pf


def _queue_producer(workload: Workload, queue: Any, stop: Any) -> None:
    for batch in BatchSource(workload)():
        if stop.is_set():
            return
        queue.put(batch)


def run_mp_queue(workload: Workload, workers: int, slots: int,
                 budget: Budget) -> Result:
    """Workers put numpy batches on a bounded multiprocessing.Queue, as
    Keras' GeneratorEnqueuer does with use_multiprocessing=True."""
    ctx = mp.get_context("forkserver" if "forkserver" in mp.get_all_start_methods()
                         else "spawn")
    t = time.perf_counter()
    queue = ctx.Queue(maxsize=slots)
    stop = ctx.Event()
    procs = [ctx.Process(target=_queue_producer, args=(workload, queue, stop),
                         daemon=True) for _ in range(workers)]
    for p in procs:
        p.start()
    try:
        return _measure(QUEUE, workload, budget, t,
                        iter(queue.get, None), _check_first_field)
    finally:
        stop.set()
        for p in procs:
            p.kill()
            p.join()
        queue.close()
        queue.cancel_join_thread()


TRANSPORTS: dict[str, Callable[[Workload, int, int, Budget], Result]] = {
    "memcpy": run_memcpy,
    "memcpy-hot": run_memcpy_hot,
    "fastq": run_fastq_batches,
    "fastq-samples": run_fastq_samples,
    "queue": run_mp_queue,
}
DEFAULT_TRANSPORTS = ("memcpy-hot", "memcpy", "fastq", "fastq-samples", "queue")
