"""Samplers and datasets that keep a state of their own (torchdata's
Stateful protocol), for tests/test_dataloader_stateful.py: importable by
name in workers of any start method."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import torch


class ResumingSampler(torch.utils.data.Sampler[int]):
    """Yields 0..n-1 from where its state says, and counts what it yields:
    a sampler that resumes itself, so a loader that also skipped the
    batches delivered would lose them twice."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.yielded = 0
        self.resume_at: int | None = None

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        start, self.resume_at = self.resume_at or 0, None
        self.yielded = start
        for i in range(start, self.n):
            self.yielded += 1
            yield i

    def state_dict(self) -> dict[str, Any]:
        return {"yielded": self.yielded}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.resume_at = state["yielded"]


class CountingCopies(torch.utils.data.Dataset[Any]):
    """Sample i is (i, the pid that made it, the samples this copy had
    made before it); its state is that count, which travels with each
    batch from the worker's copy."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.made = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, int, int]:
        self.made += 1
        return i, os.getpid(), self.made - 1

    def state_dict(self) -> dict[str, Any]:
        return {"made": self.made}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.made = state["made"]


class SlowFirst(torch.utils.data.Dataset[int]):
    """Sample i is i; index 0 takes a while, so that with in_order=False
    later batches arrive first."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i == 0:
            time.sleep(0.5)
        return i


class DrawingStream(torch.utils.data.IterableDataset[Any]):
    """Each worker's share of 0..n-1, each item paired with a draw from
    torch's generator: a stream whose items depend on the generator its
    iterator runs under (no state of its own)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[tuple[int, int]]:
        info = torch.utils.data.get_worker_info()
        wid, count = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(wid, self.n, count):
            yield i, int(torch.randint(1000, ()).item())


class StatefulIterStream(torch.utils.data.IterableDataset[Any]):
    """A stream that keeps its own place twice over: the dataset counts the
    items its iterators made, and each iterator (another object) its
    position in the worker's share of 0..n-1; a resumed iterator that also
    skipped its items again would lose them."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.made = 0

    def __iter__(self) -> PositionIterator:
        info = torch.utils.data.get_worker_info()
        wid, count = (0, 1) if info is None else (info.id, info.num_workers)
        return PositionIterator(self, list(range(wid, self.n, count)))

    def state_dict(self) -> dict[str, Any]:
        return {"made": self.made}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.made = state["made"]


class PositionIterator(Iterator[tuple[int, int]]):
    """An iterator over `items` whose state is its position; each item is
    paired with the count of items its dataset had made before it."""

    def __init__(self, dataset: StatefulIterStream, items: list[int]) -> None:
        self.dataset = dataset
        self.items = items
        self.at = 0

    def __next__(self) -> tuple[int, int]:
        if self.at >= len(self.items):
            raise StopIteration
        self.at += 1
        self.dataset.made += 1
        return self.items[self.at - 1], self.dataset.made - 1

    def state_dict(self) -> dict[str, Any]:
        return {"at": self.at}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.at = state["at"]


class EpochCountingStream(torch.utils.data.IterableDataset[Any]):
    """A stream that changes its state as its pass ends: each item comes
    with the epoch the dataset counts, which it advances after its worker's
    last item; its state is the position in the worker's share of 0..n-1
    and that epoch."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.at = 0
        self.resume_at = 0
        self.epoch = 0

    def __iter__(self) -> Iterator[tuple[int, int]]:
        info = torch.utils.data.get_worker_info()
        wid, count = (0, 1) if info is None else (info.id, info.num_workers)
        share = list(range(wid, self.n, count))
        self.at, self.resume_at = self.resume_at, 0
        while self.at < len(share):
            self.at += 1
            yield share[self.at - 1], self.epoch
        self.at = 0
        self.epoch += 1

    def state_dict(self) -> dict[str, Any]:
        return {"at": self.at, "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.resume_at, self.epoch = state["at"], state["epoch"]
