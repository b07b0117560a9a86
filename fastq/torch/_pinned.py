"""The page-locked ring, for both faces of fastq.torch: the ring registered
with CUDA once, batches handed out as pinned tensors over their slots, and
each slot returned only after the GPU work that may still read it, by a
thread of the ring's own, so that the training loop's thread never waits
for the GPU on the ring's account."""

from __future__ import annotations

import contextlib
import sys
import threading
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from ..errors import SharedMemoryError
from ._cuda import Cuda, Event, TorchCuda

# NOTE [ Page-locking the ring slot by slot ]
#
# cudaHostRegister of a whole ring (hundreds of MB with ImageNet's batches)
# takes the driver for as long as it pins and maps every page, and a copy
# queued meanwhile (the first batch's) waits behind it. So the ring is
# registered in pieces along its slots, first slot first: what lies before
# the first slot with it, then the following slots, several at once up to
# REGISTER_CHUNK_BYTES, the last piece reaching the ring's end. Between two
# calls the driver is free, so a copy waits for one piece at most, and the
# first slots are pinned first. A slot lies in one piece, so a batch's
# tensors are pinned or not as a whole; a batch in a slot not registered
# yet is pinned by copy (torch's pin_memory), as DataLoader pins it.
REGISTER_CHUNK_BYTES = 32 << 20


def register_pieces(
    total: int, slots: Sequence[tuple[int, int]] | None
) -> list[tuple[int, int]]:
    """(offset, nbytes) of each piece of a ``total``-byte ring to register,
    in order, given its slots' (offset, nbytes) (NOTE [ Page-locking the
    ring slot by slot ]); the whole ring at once without them."""
    if not slots:
        return [(0, total)]
    ends = sorted(offset + nbytes for offset, nbytes in slots)
    pieces: list[tuple[int, int]] = []
    start = 0
    for k, end in enumerate(ends):
        last = k == len(ends) - 1
        if last:
            end = total
        elif k > 0 and ends[k + 1] - start <= REGISTER_CHUNK_BYTES:
            continue  # the next slot fits in this piece too
        pieces.append((start, end - start))
        start = end
    return pieces


def _slot_owner(leaf: np.ndarray[Any, Any]) -> Any:
    """The object at the end of a slot view's base chain: its SlotLease."""
    owner: Any = leaf
    while isinstance(owner, np.ndarray):
        owner = owner.base
    return owner


# NOTE [ Slots waiting on device work ]
#
# A slot handed out as pinned tensors may still be read by a non_blocking
# copy the loop queued from it after the loop dropped the tensors. When the
# last view is dropped, an event is recorded on the current stream (the
# copy, if any, was queued on it before); the slot is kept until the GPU has
# passed that event. Waiting for it is the returner thread's job, never the
# loop's: the loop's thread launches the model's kernels and must stay free
# to run ahead of the GPU (a synchronize there idles the GPU while the next
# step is launched). The returner sleeps on the oldest event (events on one
# stream complete in order) and drops the slot's lease the moment the GPU
# passes it, so a worker can fill it again at once. The event waits for all
# the work queued by then, a step or more when the loop runs ahead: the
# engine gives a pinned ring DEVICE_SLOTS slots beyond the workers' window
# for those (fastq/_loop/_engine.py), so they do not shrink it.


class CudaRing:
    """The CUDA side of a ring: its page-locked registration, the copy
    stream (TorchPrefetcher's ``device=``), and slots waiting on GPU work.

    ``pending`` holds (event, lease holder) in the order the events were
    recorded (NOTE [ Slots waiting on device work ]). It never references
    the prefetcher, so batch finalizers keep nothing else alive.

    ``register_later`` page-locks the ring on a thread of its own instead
    of before the first batch: batches handed out before it is done are
    not pinned (torch's pin_memory then copies them, as DataLoader does),
    and if it fails the loader goes on that way, with a warning.

    ``holds_slots`` False: batches handed out keep their slot only while
    referenced (``hold`` does nothing); the image decode stage reads its
    batches' bytes on a stream of its own and keeps them until then with
    ``release_after`` (NOTE [ A batch's bytes wait for its decode ] in
    fastq/torch/_decode_stage.py).
    """

    def __init__(
        self,
        device: torch.device,
        copy_stream: bool,
        pin: bool = True,
        *,
        register_later: bool = False,
        cuda: Cuda | None = None,
        holds_slots: bool = True,
    ) -> None:
        self.device = device
        self.pin = pin
        self.cuda: Cuda = TorchCuda(device) if cuda is None else cuda
        self.pending: deque[tuple[Event, Any]] = deque()
        self.closed = False
        self.register_later = register_later
        self.holds_slots = holds_slots
        # Counters for stats(): the loop's thread's waits for the GPU (close
        # only: nothing per batch waits), and the most slots ever held for
        # device work at once.
        self.synchronizes = 0
        self.peak_waiting = 0
        self._host: np.ndarray[Any, Any] | None = None
        # Addresses and sizes registered so far (NOTE [ Page-locking the
        # ring slot by slot ]); the ring counts as registered once all are.
        self._pieces: list[tuple[int, int]] = []
        self._complete = False
        self._slots: Sequence[tuple[int, int]] | None = None
        self._mapping: Any = None
        self._settled: Callable[[], Any] = _nothing
        self._changed = threading.Condition()
        self._returner: threading.Thread | None = None
        # What was given to wait on device work after close (drop_late).
        self._late: list[Any] = []
        self._registrar: threading.Thread | None = None
        self.stream = self.cuda.copy_stream() if copy_stream else None

    # ------------------------------------------------------------ pinning

    def attach(
        self,
        mapping: Any,
        settled: Callable[[], Any],
        slots: Sequence[tuple[int, int]] | None = None,
    ) -> None:
        """Takes hold of a new ring: page-locks it if ``pin``, now or on a
        thread, once ``settled()`` has returned (its pages made huge:
        page-locked pages cannot be), slot by slot where ``slots`` gives
        each slot's (offset, nbytes) in ``mapping``."""
        if not self.pin:
            return
        self._slots = slots
        if self.register_later:
            self._mapping, self._settled = mapping, settled
            # A thread of its own: the returner must not wait for it.
            self._registrar = threading.Thread(
                target=self._register_later, name="fastq-pinned-register", daemon=True
            )
            self._registrar.start()
        else:
            settled()
            try:
                self.register(mapping)
            except SharedMemoryError:
                # Not started: no copy can read the pieces pinned so far.
                with contextlib.suppress(SharedMemoryError):
                    self.unregister_all()
                raise

    def register(self, mapping: Any) -> None:
        """Page-locks the ring, piece by piece along its slots (NOTE
        [ Page-locking the ring slot by slot ]), so copies from any slot are
        DMA transfers with no staging copy. A piece that fails raises;
        the pieces before it stay registered (close() unregisters them)."""
        # The array keeps the mapping exported (it cannot be closed) for as
        # long as it is registered.
        host = np.frombuffer(mapping, dtype=np.uint8)
        self._host = host
        base = host.ctypes.data
        for offset, nbytes in register_pieces(host.nbytes, self._slots):
            err = self.cuda.register(base + offset, nbytes)
            if err is not None:
                raise SharedMemoryError(
                    f"pin_memory=True: cudaHostRegister could not page-lock "
                    f"{nbytes} bytes of the {host.nbytes}-byte ring ({err}). "
                    "Lower slots= or batch_size=, or pass pin_memory=False "
                    "(copies then go through CUDA's staging buffers)"
                )
            with self._changed:
                self._pieces.append((base + offset, nbytes))
        self._complete = True

    def unregister_all(self) -> None:
        """Unpins every registered piece; the first failure raises, after
        the others are unpinned."""
        with self._changed:
            pieces, self._pieces = self._pieces, []
        self._complete = False
        self._host = None
        failed = None
        for address, _ in pieces:
            err = self.cuda.unregister(address)
            failed = failed or err
        if failed is not None:
            raise SharedMemoryError(f"cudaHostUnregister failed on the ring ({failed})")

    @property
    def registered(self) -> bool:
        """Every piece of the ring is page-locked."""
        return self._complete

    @property
    def registered_bytes(self) -> int:
        with self._changed:
            return sum(nbytes for _, nbytes in self._pieces)

    @property
    def waiting(self) -> int:
        """Slots released by the loop, held until their GPU work has run."""
        return len(self.pending)

    def stats(self) -> dict[str, Any]:
        return {
            "registered": self.registered,
            "registered_bytes": self.registered_bytes,
            "loop_synchronizes": self.synchronizes,
            "device_held": self.waiting,
            "peak_device_held": self.peak_waiting,
        }

    # -------------------------------------------------------------- slots

    def to_device(self, leaves: Sequence[np.ndarray[Any, Any]]) -> list[Any]:
        """Queues the leaves' copies to the device on the copy stream; the
        consumer's stream waits for them, and the slot stays leased until
        they are done."""
        assert self.stream is not None
        out, done = self.cuda.to_device(leaves, self.stream)
        self._wait_on(done, leaves)
        return out

    def pinned_tensors(
        self, leaves: Sequence[np.ndarray[Any, Any]], offsets: Sequence[int]
    ) -> list[torch.Tensor]:
        """CPU tensors over the page-locked slot, whose return waits for the
        GPU work queued when the last of them was dropped (``hold``)."""
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
        current stream, and the slot returns once the GPU has passed it."""
        if not self.holds_slots:
            return
        fin = weakref.finalize(whole, _defer_release, self, lease)
        fin.atexit = False

    def release_after(self, event: Event, holder: Any) -> None:
        """Keeps ``holder`` (what leads to a slot's lease) until the GPU has
        passed ``event``, then drops it on the returner's thread."""
        self._wait_on(event, holder)

    def _wait_on(self, event: Event, holder: Any) -> None:
        """Keeps ``holder`` (a slot's lease, or what leads to it) until the
        GPU passes ``event``. Any thread; never waits. Once the ring is
        closed (its returner gone) the holder is kept as ``late`` instead,
        until ``drop_late`` (the decode stage's thread may finish a batch
        as its loader closes)."""
        with self._changed:
            if self.closed:
                self._late.append(holder)
                return
            self.pending.append((event, holder))
            self.peak_waiting = max(self.peak_waiting, len(self.pending))
            self._changed.notify()
        if self._returner is None:
            self._start_returner()

    # ----------------------------------------------------------- returner

    def _start_returner(self) -> None:
        with self._changed:
            if self._returner is not None or self.closed:
                return
            self._returner = threading.Thread(
                target=_return_slots,
                args=(self,),
                name="fastq-pinned-returner",
                daemon=True,
            )
        self._returner.start()

    def _register_later(self) -> None:
        mapping = self._mapping
        if mapping is None or self.closed:
            return
        try:
            self._settled()
            if self.closed:
                return
            with self.cuda.device():
                self.register(mapping)
        except SharedMemoryError as exc:
            warnings.warn(
                f"{exc}. Batches in the slots not page-locked are pinned by "
                "copy instead, as DataLoader pins them",
                RuntimeWarning,
                stacklevel=1,
            )
        finally:
            # Neither keeps the ring's memory mapped once it is closed.
            self._mapping, self._settled = None, _nothing

    def _next_event(self) -> Event | None:
        """The oldest pending event, once there is one; None once closed."""
        with self._changed:
            while not self.pending and not self.closed:
                self._changed.wait()
            return None if self.closed else self.pending[0][0]

    def _passed(self, event: Event) -> Any:
        """Takes ``event``'s entry off ``pending``; its holder, for the
        caller to drop outside the lock (dropping a lease frees a slot)."""
        with self._changed:
            if self.pending and self.pending[0][0] is event:
                return self.pending.popleft()[1]
            return None

    # ---------------------------------------------------------- lifecycle

    def drop_late(self) -> None:
        """Drops what was given to wait on device work after close(), once
        the device has run all its work (a closed ring keeps no lease: a
        lease keeps its mapping). The caller's thread waits, at close only."""
        with self._changed:
            late, self._late = self._late, []
        if late:
            self.synchronizes += 1
            self.cuda.synchronize()
        del late

    def close(self) -> None:
        """Waits for every queued copy from the ring, stops the returner,
        then unpins the ring."""
        try:
            if self._pieces or self.pending or self._returner is not None:
                # Copies the user queued from pinned batches are not all in
                # `pending` yet (their tensors may be alive): the ring must
                # not be unpinned under a DMA in flight.
                self.synchronizes += 1
                self.cuda.synchronize()
        finally:
            with self._changed:
                self.closed = True
                self._changed.notify_all()
            for thread in (self._registrar, self._returner):
                if (
                    thread is not None
                    and thread is not threading.current_thread()
                    # At interpreter exit the threads never run again
                    # (NOTE [ A region closed at interpreter exit ] in
                    # fastq/_core/_shm.py).
                    and not sys.is_finalizing()
                ):
                    # Bounded: every event the returner may be waiting on
                    # has completed (synchronized above), and a
                    # registration ends.
                    thread.join()
            self.pending.clear()
            self.unregister_all()


def _nothing() -> None:
    pass


def _return_slots(ring: CudaRing) -> None:
    """The returner thread: returns each pending slot as soon as the GPU has
    passed its event (NOTE [ Slots waiting on device work ]), until the ring
    is closed."""
    with ring.cuda.device():
        while True:
            event = ring._next_event()
            if event is None:
                return
            # A CUDA error here: the context runs no more copies, so none
            # can still read the slot, and the loop's next CUDA call raises
            # the error. The slot goes back, or the loop would wait for it
            # forever.
            with contextlib.suppress(Exception):
                event.synchronize()  # sleeps (a blocking event), GIL released
            holder = ring._passed(event)
            del holder  # the slot goes back to the workers here


def _defer_release(cuda: CudaRing, owner: Any) -> None:
    """Finalizer of a pinned batch: keeps its slot until the GPU work queued
    so far on the current stream has run. Runs in whichever thread dropped
    the last tensor; never raises, never waits."""
    if cuda.closed:
        return  # close() synchronised the device; dropping `owner` frees it
    try:
        event = cuda.cuda.event()
        event.record(cuda.cuda.current_stream())
    except Exception:  # interpreter or CUDA shutting down: nothing to wait for
        return
    cuda._wait_on(event, owner)
