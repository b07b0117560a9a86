"""Batches are views of their slots: held ones never change, released ones
free their slot, and holding every slot is an error, not a hang."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest
from helpers import PatternDataset, expected_batch

import fastq

pytestmark = pytest.mark.timeout(60)


def test_held_batches_never_change_while_iteration_goes_on() -> None:
    slots = 6
    with fastq.Prefetcher(
        PatternDataset(400), batch_size=4, workers=2, slots=slots, start_method="fork"
    ) as pf:
        held = []
        for k, batch in enumerate(pf):
            if k % 10 == 0 and len(held) < slots - 1:
                held.append((k, batch))
        assert len(held) == slots - 1
        for k, batch in held:
            for got, want in zip(batch, expected_batch(range(k * 4, k * 4 + 4))):
                np.testing.assert_array_equal(got, want)


def test_holding_every_slot_raises_instead_of_hanging() -> None:
    with fastq.Prefetcher(
        PatternDataset(100), batch_size=2, workers=2, slots=3, start_method="fork"
    ) as pf:
        it = iter(pf)
        held = [next(it) for _ in range(4)]  # slots + the loop's own
        with pytest.raises(fastq.SlotsExhausted, match="all 4 slots are held"):
            next(it)
        del held


def test_releasing_a_held_batch_frees_its_slot() -> None:
    with fastq.Prefetcher(
        PatternDataset(100), batch_size=2, workers=1, slots=1, start_method="fork"
    ) as pf:
        it = iter(pf)
        first = next(it)
        second = next(it)
        del first  # frees one slot: the next batch can be produced
        third = next(it)
        np.testing.assert_array_equal(third[1], [4, 5])
        np.testing.assert_array_equal(second[1], [2, 3])


def test_a_slice_of_a_batch_keeps_its_slot() -> None:
    with fastq.Prefetcher(
        PatternDataset(100), batch_size=2, workers=1, slots=1, start_method="fork"
    ) as pf:
        it = iter(pf)
        row = next(it)[0][1]  # a view of a view keeps the lease alive
        second = next(it)
        with pytest.raises(fastq.SlotsExhausted):
            next(it)
        del row, second


def test_batches_stay_valid_after_close() -> None:
    with fastq.Prefetcher(
        PatternDataset(16), batch_size=4, workers=2, start_method="fork"
    ) as pf:
        kept = [b for _, b in zip(range(2), pf)]
    gc.collect()
    for k, batch in enumerate(kept):
        for got, want in zip(batch, expected_batch(range(k * 4, k * 4 + 4))):
            np.testing.assert_array_equal(got, want)


def test_release_from_another_thread() -> None:
    with fastq.Prefetcher(
        PatternDataset(200), batch_size=2, workers=2, slots=2, start_method="fork"
    ) as pf:
        count = 0
        for batch in pf:
            t = threading.Thread(target=lambda b: b[0].sum(), args=(batch,))
            t.start()
            t.join()
            del batch, t
            count += 1
        assert count == 100
