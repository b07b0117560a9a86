"""64 workers on a machine with few cores: every sample exactly once (in
sampler order when ordered), across epochs, under every start method; a
worker killed among them; close() leaving nothing. Producers sleep, so the
workers fit; benchmarks/many_workers.py measures what this only checks."""

from __future__ import annotations

import gc
import os
import signal
from typing import Any

import numpy as np
import pytest
from helpers import SlowDataset, alive, expected_batch
from process_checks import START_METHODS, child_pids, ring_mappings

import fastq

pytestmark = pytest.mark.timeout(120)

WORKERS = 64
BATCH = 4
SAMPLE_S = 0.001  # each __getitem__ sleeps this long

# spawn starts 64 interpreters (about 4 s on two cores): every test here runs
# it in the long form only (the delivery test through conftest's ROUTES).
SHORT_FORM = [
    pytest.param(m, marks=pytest.mark.slow) if m == "spawn" else m
    for m in START_METHODS
]


def check_gone(pids: list[int]) -> None:
    """After close() and the last reference to the Prefetcher and its
    batches: no worker, no child, no ring mapping in this process."""
    gc.collect()
    assert [p for p in pids if alive(p)] == []
    assert child_pids() == []
    assert ring_mappings() == []


def run_epochs(pf: fastq.Prefetcher, epochs: int) -> list[list[int]]:
    """Every epoch's sample indices in arrival order; each batch's content
    checked bit for bit against its indices."""
    out = []
    for _ in range(epochs):
        seen: list[int] = []
        for batch in pf:
            want = expected_batch(batch[1])
            for got, exp in zip(batch, want):
                np.testing.assert_array_equal(got, exp)
            seen.extend(batch[1].tolist())
        out.append(seen)
    return out


@pytest.mark.parametrize("ordered", [True, False], ids=["ordered", "unordered"])
def test_64_workers_deliver_every_sample_once_over_two_epochs(
    start_method: str, ordered: bool
) -> None:
    n = 1024  # 256 batches: each worker makes about four an epoch
    pf = fastq.Prefetcher(
        SlowDataset(n, SAMPLE_S),
        batch_size=BATCH,
        workers=WORKERS,
        ordered=ordered,
        start_method=start_method,
    )
    with pf:
        pids = list(pf._pool.pids)  # type: ignore[union-attr]
        assert len(set(pids)) == WORKERS
        epochs = run_epochs(pf, epochs=2)
        stats = pf.stats()
    for seen in epochs:
        if ordered:
            assert seen == list(range(n))
        else:
            assert sorted(seen) == list(range(n))
    # how many workers took part depends on how fast the machine starts
    # them (spawn on two busy cores: a fraction); the stats cover them all
    assert len(stats["workers"]) == WORKERS
    assert sum(w["batches"] for w in stats["workers"]) >= n // BATCH
    assert pf.closed
    del pf
    check_gone(pids)


def test_64_workers_with_shuffle_deliver_the_sampler_order() -> None:
    n = 1024
    with fastq.Prefetcher(
        SlowDataset(n, SAMPLE_S),
        batch_size=BATCH,
        workers=WORKERS,
        shuffle=True,
        seed=7,
    ) as pf:
        pids = list(pf._pool.pids)  # type: ignore[union-attr]
        first, second = run_epochs(pf, epochs=2)
    assert sorted(first) == sorted(second) == list(range(n))
    assert first != second  # a new permutation each epoch
    assert pf.closed
    del pf
    check_gone(pids)
    # the order is the seed's, whatever the number of workers
    with fastq.Prefetcher(
        SlowDataset(n, 0.0),
        batch_size=BATCH,
        workers=1,
        shuffle=True,
        seed=7,
        start_method="fork",
    ) as one:
        assert run_epochs(one, epochs=2) == [first, second]


@pytest.mark.parametrize("method", SHORT_FORM)
def test_a_worker_killed_among_64_gives_worker_died_and_close_is_clean(
    method: str,
) -> None:
    pf = fastq.Prefetcher(
        SlowDataset(40_000, SAMPLE_S),  # far more than the test reads
        batch_size=BATCH,
        workers=WORKERS,
        start_method=method,
    )
    with pf:
        pids = list(pf._pool.pids)  # type: ignore[union-attr]
        it = iter(pf)
        for _ in range(2 * WORKERS):  # every worker is at work by now
            next(it)
        victim = pids[37]
        os.kill(victim, signal.SIGKILL)
        delivered = 0
        with pytest.raises(fastq.WorkerDied) as info:
            for batch in it:
                delivered += 1
                del batch  # a batch held keeps the ring mapped
    msg = str(info.value)
    assert f"pid {victim}" in msg and "SIGKILL" in msg and "out-of-memory" in msg
    assert delivered < 40_000 // BATCH  # it came during the epoch
    assert pf.closed
    del pf, it, info
    check_gone(pids)


@pytest.mark.parametrize("method", SHORT_FORM)
def test_close_with_64_workers_mid_batch_leaves_nothing(method: str) -> None:
    """close() while every worker sleeps in __getitem__ or waits for a slot:
    the iterator then ends with PrefetcherClosed, and nothing is left."""
    pf = fastq.Prefetcher(
        SlowDataset(40_000, 0.05),
        batch_size=BATCH,
        workers=WORKERS,
        start_method=method,
    )
    pids = list(pf._pool.pids)  # type: ignore[union-attr]
    it = iter(pf)
    held: Any = next(it)  # a batch still held after close
    pf.close()
    pf.close()  # idempotent
    with pytest.raises(fastq.PrefetcherClosed):
        next(it)
    np.testing.assert_array_equal(held[0], expected_batch(held[1])[0])
    del held, it
    assert pf.closed
    del pf
    check_gone(pids)


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("ordered", [True, False], ids=["ordered", "unordered"])
def test_64_workers_over_many_epochs_and_rings(
    start_method: str, ordered: bool
) -> None:
    """The long form: ten shuffled epochs of 4,096 samples through a small
    ring and through the default one."""
    n = 4096
    for slots in (8, None):
        pf = fastq.Prefetcher(
            SlowDataset(n, SAMPLE_S),
            batch_size=BATCH,
            workers=WORKERS,
            slots=slots,
            ordered=ordered,
            shuffle=True,
            seed=3,
            start_method=start_method,
        )
        with pf:
            pids = list(pf._pool.pids)  # type: ignore[union-attr]
            for seen in run_epochs(pf, epochs=10):
                assert sorted(seen) == list(range(n))
        assert pf.closed
    del pf
    check_gone(pids)
