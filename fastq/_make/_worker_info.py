"""What a worker knows about itself: fastq.get_worker_info()."""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

_MASK64 = (1 << 64) - 1


@dataclass
class WorkerInfo:
    """Returned by fastq.get_worker_info() inside a worker; None elsewhere.

    Attributes
    ----------
    id : int
        This worker's number, 0 <= id < num_workers.
    num_workers : int
        Workers of this Prefetcher.
    seed : int
        The Prefetcher's base seed.
    rank, world_size : int
        This process's place among distributed ranks.
    dataset : object
        This worker's copy of the source.
    epoch, task : int
        The batch being produced (map-style sources; -1 before the first).
    """

    id: int
    num_workers: int
    seed: int
    rank: int
    world_size: int
    dataset: Any
    epoch: int = -1
    task: int = -1
    _rng: np.random.Generator | None = field(default=None, repr=False)

    @property
    def rng(self) -> np.random.Generator:
        """A Generator seeded from SeedSequence((seed, epoch, task)) for
        map-style sources, so results do not depend on which worker, or how
        many, produce a batch; from (seed, worker id) for callable sources."""
        if self._rng is None:
            key = (
                (self.seed, self.epoch, self.task)
                if self.task >= 0
                else (self.seed, 1 << 32, self.id)
            )
            self._rng = np.random.default_rng(
                np.random.SeedSequence([k & _MASK64 for k in key])
            )
        return self._rng

    def _start_task(self, epoch: int, task: int) -> None:
        self.epoch = epoch
        self.task = task
        self._rng = None


_current: WorkerInfo | None = None  # a worker process's
_thread = threading.local()  # a worker thread's, in the consumer's process


def get_worker_info() -> WorkerInfo | None:
    """This worker's WorkerInfo, or None outside a fastq worker (process or
    thread)."""
    return getattr(_thread, "info", _current)


def _set_worker_info(info: WorkerInfo | None, in_thread: bool = False) -> None:
    global _current
    if in_thread:
        _thread.info = info
    else:
        _current = info


def _answer_for_torch(info: WorkerInfo) -> None:
    """A torch IterableDataset given to a Prefetcher shards itself with
    ``torch.utils.data.get_worker_info()``, as under DataLoader: a worker
    process answers it too. Thread workers share torch's one process-wide
    answer, so they answer through ``fastq.get_worker_info()`` alone. Its
    ``seed`` is the worker's own, ``torch.initial_seed()``, as DataLoader's
    (base seed + worker id) is."""
    data = sys.modules.get("torch.utils.data")
    if data is None or not isinstance(info.dataset, data.IterableDataset):
        return
    import torch
    from torch.utils.data._utils import worker

    worker._worker_info = worker.WorkerInfo(
        id=info.id,
        num_workers=info.num_workers,
        seed=torch.initial_seed(),
        dataset=info.dataset,
    )
