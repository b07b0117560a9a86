"""What the page-locked ring's tests share: where the ring lies, and
stand-ins for the CUDA objects its bookkeeping uses, so that it is tested
without a GPU (tests/test_torch_cuda.py runs it on one)."""

from __future__ import annotations

from collections import deque
from typing import Any, ClassVar

import numpy as np
import torch

from fastq.torch._pinned import CudaRing


def ring_range(engine: Any) -> tuple[int, int]:
    """The addresses of a Prefetcher's (or a DataLoader engine's) ring."""
    assert engine._region is not None
    whole = np.frombuffer(engine._region.mapping, dtype=np.uint8)
    return whole.ctypes.data, whole.ctypes.data + whole.nbytes


def in_ring(t: Any, bounds: tuple[int, int]) -> bool:
    lo, hi = bounds
    end = t.data_ptr() + t.numel() * t.element_size()
    return bool(lo <= t.data_ptr() and end <= hi)


class FakeEvent:
    """Stands in for torch.cuda.Event: done only once synchronised."""

    made: ClassVar[list[FakeEvent]] = []

    def __init__(self) -> None:
        self.done = False
        FakeEvent.made.append(self)

    def record(self, stream: Any = None) -> None:
        pass

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True


def fake_ring(device: torch.device, copy_stream: Any = None) -> CudaRing:
    """A CudaRing that registers nothing (its batches are not really
    pinned); its events are FakeEvents once ``fake_events`` ran."""
    ring = CudaRing.__new__(CudaRing)
    ring.device, ring.pending, ring.closed = device, deque(), False
    ring._host, ring.stream, ring.pin = None, copy_stream, False
    return ring


def fake_events(monkeypatch: Any) -> None:
    """torch.cuda's events, current stream and synchronize, faked."""
    FakeEvent.made = []
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
