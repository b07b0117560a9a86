"""What the page-locked ring's tests share: where the ring lies, and
stand-ins for the CUDA objects its bookkeeping uses, so that it is tested
without a GPU (tests/test_torch_cuda.py runs it on one)."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

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


class FakeGpu:
    """The device's timeline as a test drives it: events complete in the
    order they were recorded, only when the test moves the GPU past them
    (``run_to``, ``run_all``); a synchronize() waits for that, recording
    the thread it ran on."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.recorded: list[FakeEvent] = []
        self.passed = 0  # events the GPU has passed
        self.synchronized_on: list[str] = []  # thread names

    def run_to(self, n: int) -> None:
        """The GPU passes the first ``n`` events recorded (never goes
        back)."""
        with self.changed:
            self.passed = max(self.passed, min(n, len(self.recorded)))
            self.changed.notify_all()

    def run_all(self) -> None:
        with self.changed:
            self.passed = len(self.recorded)
            self.changed.notify_all()


class FakeEvent:
    """Stands in for a torch.cuda.Event on a FakeGpu."""

    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu = gpu
        self.seq = -1

    def record(self, stream: Any = None) -> None:
        with self.gpu.changed:
            self.seq = len(self.gpu.recorded)
            self.gpu.recorded.append(self)

    @property
    def done(self) -> bool:
        return 0 <= self.seq < self.gpu.passed

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        gpu = self.gpu
        gpu.synchronized_on.append(threading.current_thread().name)
        with gpu.changed:
            gpu.changed.wait_for(lambda: self.done)


class FakeCuda:
    """fastq.torch._cuda.Cuda on a FakeGpu: nothing is registered (the
    batches are not really pinned), copies to the device are 'meta'
    tensors, and the consumer's stream records what it waited for."""

    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu = gpu
        self.registered: list[int] = []
        self.consumer = FakeStream()

    def register(self, address: int, nbytes: int) -> str | None:
        self.registered.append(nbytes)
        return None

    def unregister(self, address: int) -> str | None:
        return None

    def device(self) -> Any:
        return contextlib.nullcontext()

    def event(self) -> FakeEvent:
        return FakeEvent(self.gpu)

    def current_stream(self) -> Any:
        return self.consumer

    def copy_stream(self) -> Any:
        return object()

    def to_device(self, leaves: Any, stream: Any) -> tuple[list[Any], FakeEvent]:
        out = [torch.from_numpy(a).to("meta") for a in leaves]
        done = self.event()
        done.record(stream)
        self.consumer.wait_event(done)
        return out, done

    def synchronize(self) -> None:
        self.gpu.run_all()


class FakeStream:
    """Stands in for the consumer's torch.cuda.Stream."""

    def __init__(self) -> None:
        self.waited: list[FakeEvent] = []

    def wait_event(self, event: FakeEvent) -> None:
        self.waited.append(event)


def fake_ring(
    device: torch.device, gpu: FakeGpu, copy_stream: bool = False, pin: bool = False
) -> CudaRing:
    """A CudaRing on a FakeGpu; ``pin`` registers the ring on the returner
    thread, as the DataLoader's does."""
    return CudaRing(
        device, copy_stream, pin=pin, register_later=pin, cuda=FakeCuda(gpu)
    )


def wait_until(condition: Any, timeout: float = 10.0) -> None:
    """Until ``condition()`` holds: the returner thread gives slots back
    after the fake GPU passes their events, not at once."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the returner did not give slots back"
        time.sleep(0.005)
