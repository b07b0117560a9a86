"""Index streams for map-style sources: per-epoch permutation, sharding by
rank with DistributedSampler's semantics, batching and drop_last.

Everything is a pure function of (seed, epoch, task), so every worker and
every rank computes the same stream without talking to anyone.
"""

from __future__ import annotations

import numpy as np


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
    ) -> None:
        self.n = n
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.rank = rank
        self.world_size = world_size
        # DistributedSampler: pad by wrap-around to a multiple of world_size,
        # or, with drop_last, cut the tail that does not divide.
        if drop_last and n % world_size:
            self.per_rank = n // world_size
        else:
            self.per_rank = -(-n // world_size)
        if drop_last:
            self.batches_per_epoch = self.per_rank // batch_size
        else:
            self.batches_per_epoch = -(-self.per_rank // batch_size)
        self._epoch = -1
        self._indices = np.empty(0, dtype=np.int64)

    def epoch_indices(self, epoch: int) -> np.ndarray[tuple[int], np.dtype[np.int64]]:
        """This rank's sample indices for `epoch`, in order."""
        if epoch != self._epoch:
            self._indices = self._compute(epoch)
            self._epoch = epoch
        return self._indices

    def _compute(self, epoch: int) -> np.ndarray[tuple[int], np.dtype[np.int64]]:
        if self.shuffle:
            rng = np.random.default_rng(np.random.SeedSequence([self.seed, epoch]))
            order = rng.permutation(self.n).astype(np.int64, copy=False)
        else:
            order = np.arange(self.n, dtype=np.int64)
        total = self.per_rank * self.world_size
        if total > self.n:
            order = np.resize(order, total)  # wrap-around padding
        else:
            order = order[:total]
        return order[self.rank : total : self.world_size]

    def locate(self, task: int) -> tuple[int, int]:
        """(epoch, batch number in the epoch) of task."""
        return divmod(task, self.batches_per_epoch)

    def batch_indices(self, task: int) -> np.ndarray[tuple[int], np.dtype[np.int64]]:
        epoch, b = self.locate(task)
        start = b * self.batch_size
        return self.epoch_indices(epoch)[start : start + self.batch_size]
