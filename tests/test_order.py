"""Every index exactly once per epoch; ordered mode gives sampler order,
unordered the same multiset; epochs, shuffles and early exits."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from helpers import PatternDataset, SlowDataset

import fastq
from fastq._make._sampler import EpochSampler

pytestmark = pytest.mark.timeout(120)


def reference_epoch(n, bs, *, shuffle, seed, drop_last, rank=0, world_size=1, epoch=0):
    """DistributedSampler + DataLoader batching, written out plainly."""
    if shuffle:
        rng = np.random.default_rng(np.random.SeedSequence([seed, epoch]))
        order = list(rng.permutation(n))
    else:
        order = list(range(n))
    if drop_last and n % world_size:
        per_rank = n // world_size
    else:
        per_rank = -(-n // world_size)
    total = per_rank * world_size
    while len(order) < total:
        order += order[: total - len(order)]
    mine = order[:total][rank:total:world_size]
    batches = [mine[i : i + bs] for i in range(0, len(mine), bs)]
    if drop_last and batches and len(batches[-1]) < bs:
        batches.pop()
    return batches


@pytest.mark.parametrize(
    "shuffle,drop_last", list(itertools.product([False, True], repeat=2))
)
def test_ordered_epochs_match_sampler_order(shuffle: bool, drop_last: bool) -> None:
    n, bs = 103, 10
    with fastq.Prefetcher(
        PatternDataset(n),
        batch_size=bs,
        workers=3,
        slots=4,
        shuffle=shuffle,
        seed=7,
        drop_last=drop_last,
        start_method="fork",
    ) as pf:
        for epoch in range(3):
            got = [b[1].tolist() for b in pf]
            want = reference_epoch(
                n, bs, shuffle=shuffle, seed=7, drop_last=drop_last, epoch=epoch
            )
            assert got == want
            assert len(got) == len(pf)
            flat = sorted(itertools.chain.from_iterable(got))
            if drop_last:  # 100 distinct samples: the 3 dropped vary with the shuffle
                assert len(set(flat)) == len(flat) == 100 and set(flat) <= set(range(n))
            else:
                assert flat == list(range(n))


def test_shuffles_differ_across_epochs_and_seeds() -> None:
    def epoch_orders(seed: int) -> list[list[int]]:
        with fastq.Prefetcher(
            PatternDataset(50),
            batch_size=50,
            workers=1,
            shuffle=True,
            seed=seed,
            start_method="fork",
        ) as pf:
            return [next(iter(pf))[1].tolist() for _ in range(2)]

    a0, a1 = epoch_orders(1)
    b0, _ = epoch_orders(2)
    assert a0 != a1 and a0 != b0
    assert sorted(a0) == sorted(a1) == list(range(50))
    assert epoch_orders(1) == [a0, a1]  # reproducible


def test_unordered_gives_every_index_once() -> None:
    n, bs = 200, 7
    with fastq.Prefetcher(
        SlowDataset(n, 0.0005),
        batch_size=bs,
        workers=3,
        slots=5,
        ordered=False,
        shuffle=True,
        seed=3,
        start_method="fork",
    ) as pf:
        for _ in range(2):
            seen = list(itertools.chain.from_iterable(b[1].tolist() for b in pf))
            assert sorted(seen) == list(range(n))


def test_break_then_next_epoch_starts_fresh() -> None:
    n, bs = 60, 6
    with fastq.Prefetcher(
        PatternDataset(n), batch_size=bs, workers=2, slots=4, start_method="fork"
    ) as pf:
        for k, _ in enumerate(pf):
            if k == 2:
                break
        assert pf.epoch == 0
        got = [b[1].tolist() for b in pf]
        assert pf.epoch == 1
        assert got == reference_epoch(n, bs, shuffle=False, seed=0, drop_last=False)


def test_unordered_break_then_next_epoch() -> None:
    with fastq.Prefetcher(
        PatternDataset(60),
        batch_size=6,
        workers=2,
        slots=4,
        ordered=False,
        start_method="fork",
    ) as pf:
        next(iter(pf))
        seen = sorted(itertools.chain.from_iterable(b[1].tolist() for b in pf))
        assert seen == list(range(60))


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_rank_shards_follow_distributed_sampler(
    world_size: int, drop_last: bool
) -> None:
    n, bs = 47, 4
    shards = []
    for rank in range(world_size):
        how = dict(
            shuffle=True, seed=5, drop_last=drop_last, rank=rank, world_size=world_size
        )
        s = EpochSampler(n, bs, **how)
        got = [s.batch_indices(t).tolist() for t in range(s.batches_per_epoch)]
        assert got == reference_epoch(n, bs, **how)
        shards.append(set(itertools.chain.from_iterable(got)))
    union = set().union(*shards)
    if drop_last:
        assert sum(map(len, shards)) == len(union)  # disjoint
    else:
        assert union == set(range(n))


def test_len_is_batches_per_epoch_on_this_rank() -> None:
    with fastq.Prefetcher(
        PatternDataset(100),
        batch_size=8,
        workers=1,
        rank=1,
        world_size=3,
        start_method="fork",
    ) as pf:
        assert len(pf) == 5  # 34 samples on this rank
        assert sum(len(b[1]) for b in pf) == 34
