"""Variable-length samples side by side: fastq's jagged field against the
same samples padded to their bound, the pickled multiprocessing.Queue of
the seed's pattern (a list of per-sample arrays per batch), and a plain
memcpy of the jagged bytes.

The workload is audio-like: float32 clips of 1,000 to 16,000 values
(uniform, seeded), 32 to a batch, a label each. Every source hands over
views of 64 prepared clips, so the producers do the same cheap work and
the transports' costs show. Per case: batches/s (median of timed blocks,
each in a fresh Prefetcher or queue), the bytes a batch carries, and the
bytes one slot (or queue entry) takes.

Run: python benchmarks/jagged_vs_padded.py [--workers 1 2] [--seconds 2]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

import fastq

BATCH = 32
MAX_LEN = 16_000
MIN_LEN = 1_000
SAMPLES = 1 << 20  # long enough never to end inside a measurement
CLIPS = 64


def clips() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    lengths = rng.integers(MIN_LEN, MAX_LEN + 1, CLIPS)
    return [rng.random(int(n), dtype=np.float32) for n in lengths]


class Jagged:
    """Map-style: sample i is clip i % 64 as it is."""

    def __init__(self) -> None:
        self.clips = clips()

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.int64]:
        return self.clips[i % CLIPS], np.int64(i)


class Padded(Jagged):
    """The same samples padded to the bound, with their lengths: what a
    fixed-shape loader must carry."""

    def __init__(self) -> None:
        super().__init__()
        self.padded = []
        for c in self.clips:
            p = np.zeros(MAX_LEN, np.float32)
            p[: len(c)] = c
            self.padded.append(p)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.int64, np.int64]:  # type: ignore[override]
        k = i % CLIPS
        return self.padded[k], np.int64(len(self.clips[k])), np.int64(i)


def endless(pf: fastq.Prefetcher) -> Iterator[Any]:
    while True:
        yield from pf


def timed(
    batches: Iterator[Any], seconds: float, touch: Callable[[Any], None]
) -> float:
    """Batches/s over `seconds`, after a short warm-up."""
    for _ in range(4):
        touch(next(batches))
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        touch(next(batches))
        n += 1
    return n / (time.perf_counter() - t0)


def touch_jagged(batch: Any) -> None:
    audio = batch[0]
    audio.values[-1:].sum()  # reads the last value written


def touch_padded(batch: Any) -> None:
    batch[0][-1, -1:].sum()


def fastq_case(
    padded: bool, workers: int, seconds: float, budget: int | None
) -> dict[str, Any]:
    if padded:
        source: Any = Padded()
        spec: Any = None
        touch = touch_padded
    else:
        source = Jagged()
        spec = (fastq.Jagged("float32", max_len=MAX_LEN, budget=budget), ((), "int64"))
        touch = touch_jagged
    with fastq.Prefetcher(source, batch_size=BATCH, workers=workers, spec=spec) as pf:
        rate = timed(endless(pf), seconds, touch)
        stats = pf.stats()
        slot = pf.spec.slot_bytes
    return {
        "batches_per_s": rate,
        "bytes_per_batch": stats["bytes"] / max(1, stats["batches"]),
        "slot_bytes": slot,
    }


def _queue_producer(q: Any, worker: int, workers: int) -> None:
    data = Jagged()
    b = worker
    while True:
        start = b * BATCH
        q.put(
            (
                [data.clips[(start + j) % CLIPS] for j in range(BATCH)],
                np.arange(start, start + BATCH),
            )
        )
        b += workers


def queue_case(workers: int, seconds: float) -> dict[str, Any]:
    ctx = mp.get_context("forkserver")
    q = ctx.Queue(maxsize=2 * workers)
    procs = [
        ctx.Process(target=_queue_producer, args=(q, w, workers), daemon=True)
        for w in range(workers)
    ]
    for p in procs:
        p.start()

    def batches() -> Iterator[Any]:
        while True:
            yield q.get()

    try:
        rate = timed(batches(), seconds, lambda b: b[0][-1][-1:].sum())
    finally:
        for p in procs:
            p.kill()
            p.join()
    nbytes = statistics.mean(len(c) for c in Jagged().clips) * 4 * BATCH
    return {"batches_per_s": rate, "bytes_per_batch": nbytes, "slot_bytes": None}


def memcpy_case(seconds: float) -> dict[str, Any]:
    """One process copying each batch's clips into a destination ring."""
    data = Jagged()
    dest = [np.empty(MAX_LEN * BATCH, np.float32) for _ in range(4)]

    def batches() -> Iterator[Any]:
        b = 0
        while True:
            out = dest[b % len(dest)]
            at = 0
            for j in range(BATCH):
                c = data.clips[(b * BATCH + j) % CLIPS]
                out[at : at + len(c)] = c
                at += len(c)
            b += 1
            yield (out[:at],)

    rate = timed(batches(), seconds, lambda b: b[0][-1:].sum())
    nbytes = statistics.mean(len(c) for c in data.clips) * 4 * BATCH
    return {"batches_per_s": rate, "bytes_per_batch": nbytes, "slot_bytes": None}


Result = dict[str, Any]


def median_run(run: Callable[[], Result], repeat: int) -> Result:
    """The run with the median rate of `repeat` fresh ones."""
    runs = sorted((run() for _ in range(repeat)), key=lambda r: r["batches_per_s"])
    return runs[len(runs) // 2]


def cases(workers: int, seconds: float, budget: int) -> list[tuple[str, Any]]:
    """(label, how to run it) of every transport at `workers`."""
    return [
        ("fastq, jagged field", lambda: fastq_case(False, workers, seconds, None)),
        (
            f"fastq, jagged, budget={budget}",
            lambda: fastq_case(False, workers, seconds, budget),
        ),
        ("fastq, padded to max_len", lambda: fastq_case(True, workers, seconds, None)),
        ("mp.Queue, pickled lists", lambda: queue_case(workers, seconds)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    mean = statistics.mean(len(c) for c in clips())
    print(
        f"jagged vs padded on {platform.processor() or platform.machine()}, "
        f"{mp.cpu_count()} CPUs, Python {platform.python_version()}; {BATCH} "
        f"clips a batch, {MIN_LEN}..{MAX_LEN} float32 values each (mean "
        f"{mean:.0f}); median of {args.repeat} runs of {args.seconds} s"
    )
    limit = median_run(lambda: memcpy_case(args.seconds), args.repeat)
    rows: list[tuple[str, Any, Result]] = [
        ("memcpy of the jagged bytes (1 process)", "-", limit)
    ]
    budget = int(BATCH * mean * 1.25)  # room for batches a quarter over the mean
    for w in args.workers:
        for label, run in cases(w, args.seconds, budget):
            rows.append((label, w, median_run(run, args.repeat)))
    print(
        f"{'transport':40} {'workers':>7} {'batches/s':>10} {'x memcpy':>9} "
        f"{'MB/batch':>9} {'slot MB':>8}"
    )
    for label, w, r in rows:
        slot = "-" if r["slot_bytes"] is None else f"{r['slot_bytes'] / 1e6:.2f}"
        ratio = r["batches_per_s"] / limit["batches_per_s"]
        print(
            f"{label:40} {w:>7} {r['batches_per_s']:10.1f} {ratio:9.2f} "
            f"{r['bytes_per_batch'] / 1e6:9.2f} {slot:>8}"
        )


if __name__ == "__main__":
    main()
