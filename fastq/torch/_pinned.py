"""The page-locked ring, for both faces of fastq.torch: the ring registered
with CUDA once, batches handed out as pinned tensors over their slots, and
each slot returned only after the GPU work that may still read it."""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..errors import SharedMemoryError

# cudaHostRegisterPortable: the ring counts as pinned in every CUDA context
# of the process, not only the current device's (torch pins shared memory
# with the same flag).
_HOST_REGISTER_PORTABLE = 1


def _slot_owner(leaf: np.ndarray[Any, Any]) -> Any:
    """The object at the end of a slot view's base chain: its SlotLease."""
    owner: Any = leaf
    while isinstance(owner, np.ndarray):
        owner = owner.base
    return owner


class CudaRing:
    """The CUDA side of a ring: its page-locked registration, the copy
    stream (TorchPrefetcher's ``device=``), and slots waiting on GPU work.

    A slot whose bytes a queued copy still has to read stays leased until
    that copy's event has completed: ``pending`` holds (event, lease
    holder) in the order the events were recorded. It never references the
    prefetcher, so batch finalizers keep nothing else alive.
    """

    def __init__(
        self, device: torch.device, copy_stream: bool, pin: bool = True
    ) -> None:
        self.device = device
        self.pin = pin
        self.pending: deque[tuple[torch.cuda.Event, Any]] = deque()
        self.closed = False
        self._host: np.ndarray[Any, Any] | None = None
        with torch.cuda.device(device):
            self.stream = (
                torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
                if copy_stream
                else None
            )

    # ------------------------------------------------------------ pinning

    def attach(self, mapping: Any) -> None:
        """Takes hold of a new ring: page-locks it if ``pin``."""
        if self.pin:
            self.register(mapping)

    def register(self, mapping: Any) -> None:
        """Page-locks the whole ring once, so copies from any slot are DMA
        transfers with no staging copy."""
        # The array keeps the mapping exported (it cannot be closed) for as
        # long as it is registered.
        host = np.frombuffer(mapping, dtype=np.uint8)
        cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
        with torch.cuda.device(self.device):
            err = int(
                cudart.cudaHostRegister(
                    host.ctypes.data, host.nbytes, _HOST_REGISTER_PORTABLE
                )
            )
        if err != 0:
            raise SharedMemoryError(
                f"pin_memory=True: cudaHostRegister could not page-lock the "
                f"{host.nbytes}-byte ring ({torch.cuda.CudaError(err)}). Lower "
                "slots= or batch_size=, or pass pin_memory=False (copies then "
                "go through CUDA's staging buffers)"
            )
        self._host = host

    @property
    def registered(self) -> bool:
        return self._host is not None

    @property
    def waiting(self) -> int:
        """Slots released by the loop, held until their GPU work has run."""
        return len(self.pending)

    # -------------------------------------------------------------- slots

    def reap(self) -> None:
        """Returns the slots whose GPU work is done (events complete in the
        order they were recorded on one stream, so the oldest goes first)."""
        pending = self.pending
        while pending and pending[0][0].query():  # type: ignore[no-untyped-call]
            pending.popleft()

    def wait_oldest(self) -> None:
        if self.pending:
            self.pending[0][0].synchronize()
            self.reap()

    def to_device(self, leaves: Sequence[np.ndarray[Any, Any]]) -> list[torch.Tensor]:
        """Queues the leaves' copies to the device on the copy stream; the
        consumer's stream waits for them, and the slot stays leased until
        they are done."""
        self.reap()
        consumer = torch.cuda.current_stream(self.device)
        assert self.stream is not None
        with torch.cuda.stream(self.stream):
            out = [
                torch.from_numpy(a).to(self.device, non_blocking=True) for a in leaves
            ]
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            done.record(self.stream)
        consumer.wait_event(done)
        for t in out:
            # Allocated on the copy stream, used on the consumer's: the
            # allocator must not hand their memory to the next copy while
            # the consumer's queued work still reads it.
            t.record_stream(consumer)
        self.pending.append((done, leaves))
        return out

    def pinned_tensors(
        self, leaves: Sequence[np.ndarray[Any, Any]], offsets: Sequence[int]
    ) -> list[torch.Tensor]:
        """CPU tensors over the page-locked slot, whose return waits for the
        GPU work queued when the last of them was dropped (``hold``)."""
        self.reap()
        owner = _slot_owner(leaves[0])
        # One array over the slot that every leaf views: its finalizer
        # runs when the last tensor (hence the last leaf) is garbage.
        whole = np.frombuffer(owner, dtype=np.uint8)
        views = [
            np.ndarray(a.shape, a.dtype, buffer=whole, offset=off)
            for a, off in zip(leaves, offsets)
        ]
        self.hold(whole, owner)
        return [torch.from_numpy(v) for v in views]

    def hold(self, whole: np.ndarray[Any, Any], lease: Any) -> None:
        """When ``whole`` (the array every view of the slot is made from) is
        garbage, the slot is not freed at once: an event is recorded on the
        current stream, so a non_blocking copy queued from its tensors
        finishes reading before a worker may overwrite the slot."""
        fin = weakref.finalize(whole, _defer_release, self, lease)
        fin.atexit = False

    def make_room(self, consumer: Any, nslots: int) -> None:
        """Called before ``consumer`` sleeps for a batch: slots that only
        wait for GPU work would make the ring report SlotsExhausted, so that
        work is waited for instead, oldest first."""
        self.reap()
        while self.pending and consumer.held + consumer.in_window >= nslots:
            self.wait_oldest()

    # ---------------------------------------------------------- lifecycle

    def close(self) -> None:
        """Waits for every queued copy from the ring, then unpins it."""
        self.closed = True
        try:
            if self.registered or self.pending:
                # Copies the user queued from pinned batches are not all in
                # `pending` yet (their tensors may be alive): the ring must
                # not be unpinned under a DMA in flight.
                torch.cuda.synchronize(self.device)
        finally:
            self.pending.clear()
            host, self._host = self._host, None
            if host is not None:
                cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
                err = int(cudart.cudaHostUnregister(host.ctypes.data))
                if err != 0:
                    raise SharedMemoryError(
                        f"cudaHostUnregister failed on the ring "
                        f"({torch.cuda.CudaError(err)})"
                    )


def _defer_release(cuda: CudaRing, owner: Any) -> None:
    """Finalizer of a pinned batch: keeps its slot until the GPU work queued
    so far on the current stream has run. Runs in whichever thread dropped
    the last tensor; never raises."""
    if cuda.closed:
        return  # close() synchronised the device; dropping `owner` frees it
    try:
        event = torch.cuda.Event()  # type: ignore[no-untyped-call]
        event.record(torch.cuda.current_stream(cuda.device))
    except Exception:  # interpreter or CUDA shutting down: nothing to wait for
        return
    cuda.pending.append((event, owner))
