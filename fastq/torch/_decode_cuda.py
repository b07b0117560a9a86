"""The CUDA calls the image decode stage makes, behind one object: the
pinned ring's (fastq/torch/_cuda.py) and the stage's own (a stream for
decoding, uploads, the hand-over to the compute stream). Tests fake it,
with tensors on the CPU and events that complete when the test says."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import torch

from ._cuda import Cuda, Event, TorchCuda


class DecodeCuda(Cuda, Protocol):
    """What the decode stage (fastq/torch/_decode_stage.py) asks of one
    device, beyond what the pinned ring asks."""

    @property
    def tensor_device(self) -> torch.device:
        """Where the stage's tensors live (the GPU; a fake's: the CPU)."""
        ...

    def decode_stream(self) -> Any:
        """A stream of the stage's own, for decoding and its kernels."""
        ...

    def on_stream(self, stream: Any) -> contextlib.AbstractContextManager[Any]:
        """Makes ``stream`` current in this thread: the kernels torch
        launches inside run on it."""
        ...

    def upload(self, host: torch.Tensor) -> torch.Tensor:
        """``host``'s copy on the device, queued on the current stream,
        never waiting for it (a page-locked staging copy if ``host`` is not
        page-locked)."""
        ...

    def hand_over(self, tensors: Sequence[torch.Tensor], done: Event) -> None:
        """The consumer's (current) stream waits for ``done``, and the
        allocator keeps ``tensors`` until the consumer's work queued so far
        has run."""
        ...


class TorchDecodeCuda(TorchCuda):
    """torch.cuda, for one device, as the decode stage uses it."""

    @property
    def tensor_device(self) -> torch.device:
        return self._device

    def decode_stream(self) -> Any:
        return self.copy_stream()

    @contextlib.contextmanager
    def on_stream(self, stream: Any) -> Iterator[None]:
        with torch.cuda.device(self._device), torch.cuda.stream(stream):
            yield

    def upload(self, host: torch.Tensor) -> torch.Tensor:
        # From pageable memory a copy would wait for the stream's queued
        # work before it returns: staged through page-locked memory (torch's
        # caching host allocator keeps it until the copy has run). A strided
        # source (Pillow's pixels, permuted) is made contiguous first: torch
        # would otherwise make it so in pageable memory, inside the copy.
        if not host.is_contiguous():
            host = host.contiguous()
        staged = host if host.is_pinned() else host.pin_memory()
        return staged.to(self._device, non_blocking=True)

    def hand_over(self, tensors: Sequence[torch.Tensor], done: Event) -> None:
        consumer = torch.cuda.current_stream(self._device)
        consumer.wait_event(done)  # type: ignore[arg-type]
        for t in tensors:
            # Made on the decode stream, read on the consumer's: their memory
            # must not go to the next batch's decode while the step that
            # reads them is still queued.
            t.record_stream(consumer)
