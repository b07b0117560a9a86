"""The `get_batch(num_workers, batch_size)` program that fastq grew from,
fed by fastq instead of Keras' GeneratorEnqueuer.

The original wraps a generator that calls `data_provide()` for one
(image, label) at a time, appends it to two lists, and yields them every
`batch_size` samples; `GeneratorEnqueuer(generator(...),
use_multiprocessing=True)` runs copies of it in worker processes, and
`get_batch` polls the enqueuer's queue with `time.sleep(0.01)` between
looks. Here the worker yields *samples*; fastq writes each one straight
into its row of a preallocated shared-memory slot, and the training loop
reads the batch in place. What changed:

- No sleep-polling: the loop blocks on the slot it needs and wakes the
  moment a worker publishes it (the original sleeps up to 10 ms a batch).
- No pickling: a batch never passes through a pipe; its bytes are written
  once, by the worker, into memory the loop reads.
- Per-worker randomness that is distinct and reproducible: each worker's
  `get_worker_info().rng` is its own stream from (seed, worker id). The
  enqueuer reseeds numpy's global generator in each worker (from the OS,
  unless given a seed) and leaves Python's `random` as forked: the same in
  every worker.
- Errors arrive: an exception in `data_provide` is raised in the training
  loop with the worker's traceback. The original generator prints it and
  goes on; the enqueuer, for an exception past that, stops, and
  `get_batch` then yields None at every `next()`.
- Threads or processes, by one argument (`--method thread`): threads need
  no pickling or process start and pay where decoding releases the GIL.
- Shutdown is bounded: leaving the `with` block, Ctrl+C or a killed worker
  stops and reaps every worker and frees the shared memory.

Run: python examples/get_batch.py [--workers 2] [--batch-size 128]
                                  [--method process|thread] [--batches 50]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Iterator

import numpy as np

import fastq

IMAGE_SHAPE = (64, 64, 3)
CLASSES = 2


def data_provide(rng: np.random.Generator) -> tuple[np.ndarray, np.int64]:
    """One (image, label), as the original's data_provide() returns: here a
    random image standing in for a decoded file."""
    image = rng.integers(0, 256, size=IMAGE_SHAPE, dtype=np.uint8)
    label = np.int64(rng.integers(CLASSES))
    return image, label


def samples() -> Iterator[tuple[np.ndarray, np.int64]]:
    """One worker's endless stream of samples: the original generator's
    loop, without its lists and batching."""
    info = fastq.get_worker_info()
    assert info is not None  # fastq calls this in a worker
    rng = info.rng  # this worker's own stream
    while True:
        yield data_provide(rng)


def get_batch(
    num_workers: int, batch_size: int, method: str = "process"
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Endless (images, labels) batches, as the original's get_batch. The
    workers stop when this generator is closed (or garbage)."""
    with fastq.Prefetcher(
        samples, batch_size=batch_size, workers=num_workers, worker_method=method
    ) as pf:
        yield from pf


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--method", choices=["process", "thread"], default="process")
    parser.add_argument("--batches", type=int, default=50)
    args = parser.parse_args()

    gen = get_batch(args.workers, args.batch_size, args.method)
    waits = []
    firsts = set()
    for _ in range(args.batches):
        start = time.perf_counter()
        images, labels = next(gen)
        waits.append(time.perf_counter() - start)
        firsts.add(images[0].tobytes())  # a worker repeating another shows here
    gen.close()
    print(f"images {images.shape} {images.dtype}, labels {labels.shape} {labels.dtype}")
    print(
        f"{args.batches} batches from {args.workers} {args.method} workers: "
        f"median wait {statistics.median(waits) * 1e3:.2f} ms a batch "
        f"(the first {waits[0] * 1e3:.0f} ms, starting the workers)"
    )
    print(f"distinct first images: {len(firsts)} of {args.batches}")


if __name__ == "__main__":
    main()
