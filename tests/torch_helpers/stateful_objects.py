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
