"""Module-level datasets for the fastq.torch.DataLoader tests (picklable
under every start method)."""

from __future__ import annotations

import os
from collections import namedtuple
from typing import Any

import numpy as np
import torch
import torch.utils.data

Point = namedtuple("Point", "index weight")


class Mixed(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Sample i: a tensor, an int, a string, a namedtuple and a dict, so the
    batch's structure and types can be compared with DataLoader's."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return (
            torch.arange(6, dtype=torch.float32).reshape(2, 3) + i,
            i,
            f"s{i}",
            Point(np.int64(i), np.float64(i) / 3),
            {"half": torch.tensor(i / 2, dtype=torch.float64), "raw": b"x"},
        )


class Augmented(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Sample i plus torch, numpy and random noise: what a random
    augmentation gives."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        import random

        return torch.rand(3) + i, np.random.rand(), random.random()


class FailsAt(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Raises KeyError for one index."""

    def __init__(self, n: int, bad: int) -> None:
        self.n = n
        self.bad = bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if i == self.bad:
            raise KeyError(f"no sample {i}")
        return torch.tensor(i)


class OnlyInWorkers(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Fails if read in the process that made it: the HDF5/LMDB pattern of a
    handle opened in each worker."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.owner = os.getpid()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if os.getpid() == self.owner:
            raise AssertionError("the dataset was read in the consumer")
        return torch.tensor(i)


class WorkerReport(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Sample i: what torch.utils.data.get_worker_info() says in the worker."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        info = torch.utils.data.get_worker_info()
        assert info is not None
        return torch.tensor(
            [
                i,
                info.id,
                info.num_workers,
                int(info.seed == torch.initial_seed()),
                int(isinstance(info.dataset, WorkerReport)),
                os.getpid(),
            ]
        )


class Sharded(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """0..n-1, each worker taking every num_workers-th item, as torch's
    documentation shows; it also has a len, which must not make it
    map-style."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Any:
        info = torch.utils.data.get_worker_info()
        if info is None:
            return iter(range(self.n))
        return iter(range(info.id, self.n, info.num_workers))


class Pairs(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """A list of (tensor, tensor) samples, as the DDP tutorial's dataset
    holds: each storage used to cost a descriptor per worker."""

    def __init__(self, n: int) -> None:
        self.data = [(torch.rand(20), torch.rand(1)) for _ in range(n)]

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> Any:
        return self.data[i]


class Growing(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if i >= self.n:
            raise IndexError(i)
        return torch.tensor(i)


def seed_torch_in_worker(worker_id: int) -> None:
    torch.manual_seed(1234 + worker_id)


class FailsBelow(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Raises KeyError for every index below `bad_below`: the first batches
    of an unshuffled epoch fail, before any batch could size the slots."""

    def __init__(self, n: int, bad_below: int) -> None:
        self.n = n
        self.bad_below = bad_below

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if i < self.bad_below:
            raise KeyError(f"no sample {i}")
        return torch.tensor(i)


class FirstItemFails(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """Each worker's shard of 0..n-1, whose first item raises ValueError in
    worker `failing` (the stream goes on after it, as a generator that
    catches nothing cannot; this one is an iterator object)."""

    def __init__(self, n: int, failing: int = 0) -> None:
        self.n = n
        self.failing = failing

    def __iter__(self) -> Any:
        info = torch.utils.data.get_worker_info()
        wid, workers = (0, 1) if info is None else (info.id, info.num_workers)
        return _FailFirst(range(wid, self.n, workers), wid == self.failing)


class _FailFirst:
    def __init__(self, items: range, fail: bool) -> None:
        self.items = iter(items)
        self.fail = fail

    def __iter__(self) -> _FailFirst:
        return self

    def __next__(self) -> int:
        if self.fail:
            self.fail = False
            raise ValueError("the first item is bad")
        return next(self.items)


class MarksFirst(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Sample i is i; making sample 0 writes the maker's pid into `path`
    (a test stops that process there)."""

    def __init__(self, n: int, path: str) -> None:
        self.n = n
        self.path = path

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if i == 0:
            with open(self.path + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.replace(self.path + ".tmp", self.path)
        return torch.tensor(i)


class Turns(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """Worker w's stream: (w, k) for k < counts[w], except that item (w, k)
    in `bad` raises ValueError("bad w k") and the stream goes on; worker
    `slow` sleeps `delay` seconds before each item (so, without turns, the
    others' items would come first)."""

    def __init__(
        self,
        counts: list[int],
        bad: tuple[tuple[int, int], ...] = (),
        slow: int = -1,
        delay: float = 0.0,
    ) -> None:
        self.counts = counts
        self.bad = set(bad)
        self.slow = slow
        self.delay = delay

    def __iter__(self) -> Any:
        info = torch.utils.data.get_worker_info()
        self.worker = 0 if info is None else info.id
        self.k = 0
        return self

    def __next__(self) -> tuple[int, int]:
        w, k = self.worker, self.k
        if k >= self.counts[w]:
            raise StopIteration
        self.k += 1
        if w == self.slow:
            import time

            time.sleep(self.delay)
        if (w, k) in self.bad:
            raise ValueError(f"bad {w} {k}")
        return w, k
