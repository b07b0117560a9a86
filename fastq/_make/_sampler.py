"""Index streams for map-style sources: per-epoch permutation, sharding by
rank with DistributedSampler's semantics, batching and drop_last.

Everything is a pure function of (seed, epoch, task), so every worker and
every rank computes the same stream without talking to anyone.

An epoch resumed on another number of ranks (a ``Reshard``) is the one
exception: its samples not yet delivered are sharded afresh across the new
ranks, and they fill the last batches of the epoch's numbering, so the rest
of the machinery (task numbers, skipping the batches before a state) is that
of any resumed epoch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def shard_sizes(
    n: int, batch_size: int, world_size: int, drop_last: bool
) -> tuple[int, int]:
    """(samples per rank, batches per rank) for n samples, with
    DistributedSampler's padding by wrap-around (or, with drop_last, its cut
    of the tail that does not divide), then batching."""
    if drop_last and n % world_size:
        per_rank = n // world_size
    else:
        per_rank = -(-n // world_size)
    if drop_last:
        return per_rank, per_rank // batch_size
    return per_rank, -(-per_rank // batch_size)


@dataclass(frozen=True)
class Reshard:
    """Epoch ``epoch`` went on with other numbers of ranks: ``steps`` holds,
    for each world size it ran with, the batches every rank had delivered
    when it stopped.

    Ranks that each delivered k batches of bs samples have delivered a
    prefix of k * bs * world_size of the sequence they shared (rank r takes
    positions r, r + world_size, ...), so what is left is a suffix of it,
    and that suffix is what the next world size shards.
    """

    epoch: int
    steps: tuple[tuple[int, int], ...]

    def remaining(self, n: int, batch_size: int) -> int:
        """How many samples of the epoch are left to the current ranks."""
        for world_size, batches in self.steps:
            n = max(0, n - batches * batch_size * world_size)
        return n

    def left_of(self, order: np.ndarray, batch_size: int) -> np.ndarray:
        for world_size, batches in self.steps:
            order = order[batches * batch_size * world_size :]
        return order


class EpochSampler:
    """Task t is batch t % batches_per_epoch of epoch t // batches_per_epoch."""

    def __init__(
        self,
        n: int,
        batch_size: int,
        *,
        shuffle: bool,
        seed: int,
        drop_last: bool,
        rank: int,
        world_size: int,
        reshard: Reshard | None = None,
    ) -> None:
        self.n = n
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.rank = rank
        self.world_size = world_size
        self.per_rank, self.batches_per_epoch = shard_sizes(
            n, batch_size, world_size, drop_last
        )
        # (epoch, its indices, its first batch), one attribute so that
        # threads sharing this sampler never see parts of two epochs.
        self._cached: tuple[int, np.ndarray, int] | None = None
        self.reshard = reshard

    @property
    def reshard(self) -> Reshard | None:
        return self._reshard

    @reshard.setter
    def reshard(self, reshard: Reshard | None) -> None:
        # A resumed epoch's order changes with it: the cached one is stale.
        self._reshard = reshard
        self._cached = None

    def first_batch(self, epoch: int) -> int:
        """The epoch's first batch number: 0, but for a resharded epoch,
        whose remaining samples fill its last batches."""
        reshard = self.reshard
        if reshard is None or reshard.epoch != epoch:
            return 0
        left = reshard.remaining(self.n, self.batch_size)
        _, batches = shard_sizes(left, self.batch_size, self.world_size, self.drop_last)
        return self.batches_per_epoch - batches

    def epoch_indices(self, epoch: int) -> np.ndarray[tuple[int], np.dtype[np.int64]]:
        """This rank's sample indices for `epoch`, in order, from its first
        batch's first sample."""
        return self._epoch_order(epoch)[0]

    def _epoch_order(self, epoch: int) -> tuple[np.ndarray, int]:
        """(epoch_indices(epoch), first_batch(epoch)), cached per epoch."""
        cached = self._cached
        if cached is None or cached[0] != epoch:
            cached = (epoch, self._compute(epoch), self.first_batch(epoch))
            self._cached = cached
        return cached[1], cached[2]

    def _compute(self, epoch: int) -> np.ndarray[tuple[int], np.dtype[np.int64]]:
        if self.shuffle:
            rng = np.random.default_rng(np.random.SeedSequence([self.seed, epoch]))
            order = rng.permutation(self.n).astype(np.int64, copy=False)
        else:
            order = np.arange(self.n, dtype=np.int64)
        if self.reshard is not None and self.reshard.epoch == epoch:
            order = self.reshard.left_of(order, self.batch_size)
        if len(order) == 0:
            return order
        per_rank, _ = shard_sizes(
            len(order), self.batch_size, self.world_size, self.drop_last
        )
        total = per_rank * self.world_size
        if total > len(order):
            order = np.resize(order, total)  # wrap-around padding
        else:
            order = order[:total]
        return order[self.rank : total : self.world_size]

    def locate(self, task: int) -> tuple[int, int]:
        """(epoch, batch number in the epoch) of task."""
        return divmod(task, self.batches_per_epoch)

    def batch_indices(self, task: int) -> np.ndarray[tuple[int], np.dtype[np.int64]]:
        epoch, b = self.locate(task)
        indices, first = self._epoch_order(epoch)
        start = (b - first) * self.batch_size
        assert start >= 0, "a resharded epoch's batch before its first"
        return indices[start : start + self.batch_size]
