"""What the tests of fastq.torch.DataLoader check batches and workers with."""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

import torch


def same(a: Any, b: Any) -> bool:
    """Equal structure, types and values (tensors bit for bit)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def children() -> list[int]:
    """This process's fastq worker processes."""
    return [p.pid for p in mp.active_children() if p.name.startswith("fastq-")]
