"""The measurements besides throughput: hand-over latency, time to the first
batch under spawn, system calls and page faults at steady state, and a
compute-bound workload measured against its ideal."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Sequence

from .._faces._prefetcher import _cpus_per_rank
from .measure import Options
from .transports import AUTO, TRANSPORTS, Case
from .workloads import WORKLOADS, Producer, ProducerConfig

# Latency: the producer makes a batch every LATENCY_PACE_S (far slower than
# any transport's capacity), so each batch finds the consumer waiting and the
# time from "batch made" to "batch in the consumer's hands" is the hand-over
# alone, wake-up included.
LATENCY_WORKLOAD = "small"
LATENCY_PACE_S = 0.001
STARTUP_WORKLOAD = "imagenet"
STARTUP_METHOD = "spawn"
STARTUP_REPEATS = 3
COMPUTE_WORKLOAD = "compute"
# Steady state: system calls and page faults per batch, counted by perf on
# both sides. Free-running, a side that waits longer than fastq's spin
# (FASTQ_SPIN_US, 50 us) sleeps on a futex: one wait and one wake per batch
# when the ring runs empty (or full). With a spin longer than any wait, no
# waiter ever sleeps, so whatever is left is the data path's own cost.
STEADY_WORKLOADS = ("small", "imagenet")
# The consumer's own cost per batch: each next() timed alone while the
# producer is ahead by a deep ring's worth (every call finds its batch).
HANDOVER_WORKLOADS = ("small", "medium")
HANDOVER_SLOTS = 16
STEADY_LONG_SPIN_US = 20_000


def throughput(
    shapes: Sequence[str],
    transports: Sequence[str],
    workers: Sequence[int],
    slots: int | None,
) -> list[Case]:
    return [
        Case(t, s, w, slots or 2 * w)
        for s in shapes
        for w in workers
        for t in transports
        if t != AUTO
    ]


def latency(transports: Sequence[str], slots: int | None) -> list[Case]:
    return [
        Case(t, LATENCY_WORKLOAD, 1, slots or 2, pace_s=LATENCY_PACE_S)
        for t in transports
        if t not in ("memcpy-hot", AUTO)
    ]


def handover(transports: Sequence[str], slots: int | None) -> list[Case]:
    return [
        Case(t, s, 1, slots or HANDOVER_SLOTS)
        for s in HANDOVER_WORKLOADS
        for t in transports
        if t not in ("memcpy-hot", AUTO)
    ]


def startup(transports: Sequence[str], slots: int | None) -> list[Case]:
    return [
        Case(t, STARTUP_WORKLOAD, 1, slots or 2, start_method=STARTUP_METHOD)
        for t in transports
        if TRANSPORTS[t].role != "limit" and t != AUTO
        for _ in range(STARTUP_REPEATS)
    ]


def steady(transports: Sequence[str], slots: int | None) -> list[tuple[Case, Options]]:
    """Free-running for every transport; fastq again with waiters that never
    sleep (run isolated: the spin is read when fastq is imported)."""
    jobs = [
        (Case(t, s, 1, slots or 2), Options(perf=True, note="free-running"))
        for s in STEADY_WORKLOADS
        for t in transports
        if TRANSPORTS[t].role != "limit" and t != AUTO
    ]
    jobs += [
        (
            Case(t, s, 1, slots or 2),
            Options(
                perf=True,
                spin_us=STEADY_LONG_SPIN_US,
                note=f"spin {STEADY_LONG_SPIN_US // 1000} ms",
            ),
        )
        for s in STEADY_WORKLOADS
        for t in transports
        if TRANSPORTS[t].role == "fastq" and t != AUTO
    ]
    return jobs


def compute(
    transports: Sequence[str],
    workers: Sequence[int],
    slots: int | None,
    workload: str = COMPUTE_WORKLOAD,
) -> list[Case]:
    """Every transport at each worker count; workers="auto" once, with
    as many slots as the most workers it can run."""
    jobs = [
        Case(t, workload, w, slots or 2 * w)
        for w in workers
        for t in transports
        if TRANSPORTS[t].role != "limit" and t != AUTO
    ]
    if AUTO in transports:
        pool = auto_pool()
        jobs.append(Case(AUTO, workload, pool, slots or 2 * pool))
    return jobs


def auto_pool() -> int:
    """The workers that workers="auto" starts here."""
    return _cpus_per_rank()


def compute_ideal(
    workers: Sequence[int], workload: str = COMPUTE_WORKLOAD, repeats: int = 9
) -> dict[int, float]:
    """Batches/s if producing were the only cost: a compute workload's
    batch time in this process (median of `repeats`), times the workers that
    have a CPU of their own."""
    producer = Producer(ProducerConfig(WORKLOADS[workload]))
    producer.batch(0)
    times = []
    for n in range(1, repeats + 1):
        t = time.perf_counter()
        producer.batch(n)
        times.append(time.perf_counter() - t)
    per_batch = statistics.median(times)
    cpus = (
        len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count() or 1
    )
    return {w: min(w, cpus) / per_batch for w in (*workers, auto_pool())}
