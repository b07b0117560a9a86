"""The CUDA calls a page-locked ring makes, behind one object: torch's
(``TorchCuda``) on a GPU, the GPU-timeline model's
(fastq/_bench/gpu_model.py) where a benchmark or a test measures the
pinned path without one. Nothing else in fastq.torch reaches CUDA for the
ring, so whatever the model stands in for here is all there is."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import numpy as np
import torch

# cudaHostRegisterPortable: the ring counts as pinned in every CUDA context
# of the process, not only the current device's (torch pins shared memory
# with the same flag).
_HOST_REGISTER_PORTABLE = 1


class Event(Protocol):
    def record(self, stream: Any = None) -> None: ...
    def query(self) -> bool: ...
    def synchronize(self) -> None: ...


class Cuda(Protocol):
    """What CudaRing (fastq/torch/_pinned.py) asks of one device."""

    def register(self, address: int, nbytes: int) -> str | None:
        """Page-locks [address, address + nbytes); the error's name, or
        None."""
        ...

    def unregister(self, address: int) -> str | None: ...

    def device(self) -> contextlib.AbstractContextManager[Any]:
        """Makes the ring's device current in this thread."""
        ...

    def event(self) -> Event:
        """An event whose synchronize() sleeps (no spinning core)."""
        ...

    def current_stream(self) -> Any: ...

    def copy_stream(self) -> Any:
        """A stream of its own for copies to the device."""
        ...

    def to_device(
        self, leaves: Sequence[np.ndarray[Any, Any]], stream: Any
    ) -> tuple[list[Any], Event]:
        """The leaves' non_blocking copies queued on ``stream``, and an
        event recorded after them; the current stream waits for that event
        and may use the copies."""
        ...

    def synchronize(self) -> None:
        """Waits for all work queued on the device."""
        ...


class TorchCuda:
    """torch.cuda, for one device."""

    def __init__(self, device: torch.device) -> None:
        self._device = device

    def register(self, address: int, nbytes: int) -> str | None:
        cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
        with torch.cuda.device(self._device):
            err = int(cudart.cudaHostRegister(address, nbytes, _HOST_REGISTER_PORTABLE))
        return None if err == 0 else str(torch.cuda.CudaError(err))

    def unregister(self, address: int) -> str | None:
        cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
        err = int(cudart.cudaHostUnregister(address))
        return None if err == 0 else str(torch.cuda.CudaError(err))

    @contextlib.contextmanager
    def device(self) -> Iterator[None]:
        with torch.cuda.device(self._device):
            yield

    def event(self) -> Event:
        # blocking: cudaEventBlockingSync, so that a thread waiting on it
        # sleeps instead of spinning a core the workers need.
        return torch.cuda.Event(blocking=True)  # type: ignore[no-untyped-call]

    def current_stream(self) -> Any:
        return torch.cuda.current_stream(self._device)

    def copy_stream(self) -> Any:
        with torch.cuda.device(self._device):
            return torch.cuda.Stream(self._device)  # type: ignore[no-untyped-call]

    def to_device(
        self, leaves: Sequence[np.ndarray[Any, Any]], stream: Any
    ) -> tuple[list[Any], Event]:
        consumer = torch.cuda.current_stream(self._device)
        with torch.cuda.stream(stream):
            out = [
                torch.from_numpy(a).to(self._device, non_blocking=True) for a in leaves
            ]
            done = torch.cuda.Event(blocking=True)  # type: ignore[no-untyped-call]
            done.record(stream)
        consumer.wait_event(done)
        for t in out:
            # Allocated on the copy stream, used on the consumer's: the
            # allocator must not hand their memory to the next copy while
            # the consumer's queued work still reads it.
            t.record_stream(consumer)
        return out, done

    def synchronize(self) -> None:
        torch.cuda.synchronize(self._device)
