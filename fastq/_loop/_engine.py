"""The engine both faces hold: the worker pool, the shared region and its
ring, the feed, workers="auto"'s tuner and a page-locked ring's pinning;
started in the order the workers need, stopped in the one safe order."""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, NoReturn, Protocol

import numpy as np

from .._core._ring import MAX_SLOTS, Ring, SlotLease, region_size
from .._core._shm import PAGE_SIZE, Region
from .._workers._pool import WorkerPool
from ..errors import PrefetcherClosed, RingError, SharedMemoryError
from ._autotune import Autotuner
from ._consumer import Feed

# How long a waiter spins before it sleeps: longer than a small batch takes
# to produce, far shorter than a scheduler tick.
SPIN_NS = int(os.environ.get("FASTQ_SPIN_US", "50")) * 1000


def check_open(closed: bool, pid: int) -> None:
    """Refuses a closed face, and one a forked child inherited."""
    if closed:
        raise PrefetcherClosed("this Prefetcher is closed; create a new one")
    if os.getpid() != pid:
        raise PrefetcherClosed(
            f"this Prefetcher belongs to process {pid}; a forked "
            f"child (pid {os.getpid()}) cannot iterate it (its batches "
            "and slots are the parent's). Create a Prefetcher in the child"
        )


def in_main_thread() -> bool:
    """Workers may die with this thread (PR_SET_PDEATHSIG follows the
    thread that forked them) only if it is the main one."""
    return threading.current_thread() is threading.main_thread()


class BatchMaker(Protocol):
    """What a face hands out for each batch: ``make_batch`` turns a plain
    slot's leaf arrays (views, or copies) into it; ``unpack`` a packed
    slot's lease (a DataLoader's); ``lane_ended`` keeps what a lane's end
    marker carries (a stateful dataset's state). Holds no reference to its
    face."""

    def make_batch(self, arrays: list[np.ndarray[Any, Any]]) -> Any: ...
    def unpack(self, lease: SlotLease) -> Any: ...
    def lane_ended(self, lease: SlotLease) -> None: ...


class PlainBatches:
    """A Prefetcher's batch: the leaves (views of the slot, or copies) in
    the source's structure."""

    def __init__(self, spec: Any) -> None:
        self.spec = spec

    def make_batch(self, arrays: list[np.ndarray[Any, Any]]) -> Any:
        return self.spec.unflatten(arrays)

    def unpack(self, lease: SlotLease) -> Any:
        raise RingError(
            f"slot {lease.slot} holds a packed batch, but this ring's slots "
            "hold fixed fields"
        )

    def lane_ended(self, lease: SlotLease) -> None:
        """A Prefetcher's end markers carry nothing."""


class SlotPinning(Protocol):
    """A page-locked ring (fastq/torch/_pinned.py): attached once the ring
    and its workers exist, it keeps a released slot until the device work
    that may still read it has run, and is closed before the ring
    closes."""

    @property
    def waiting(self) -> int: ...
    def attach(
        self,
        mapping: Any,
        settled: Callable[[], Any],
        slots: list[tuple[int, int]] | None = None,
    ) -> None: ...
    def hold(self, whole: np.ndarray[Any, Any], lease: Any) -> None: ...
    def stats(self) -> dict[str, Any]: ...
    def close(self) -> None: ...


# Slots a pinned ring has beyond the workers' window, for batches the loop
# dropped whose device work is still queued (NOTE [ Slots waiting on device
# work ] in fastq/torch/_pinned.py): the step in flight on the GPU and the
# steps the loop runs ahead of it, which CUDA's launch queue bounds to a few.
# Without them, a GPU-bound loop's held slots come out of the window, and
# the workers stall while the GPU still has a batch to read.
DEVICE_SLOTS = 4


# NOTE [ The ring is pinned after its workers start ]
#
# Page-locking the ring (cudaHostRegister) is the first CUDA call a loader
# makes, and the driver may mark page-locked memory so that a forked child
# does not inherit it. The ring is therefore pinned only once its workers
# exist: they fork from a process in which it is not yet pinned. Workers
# map a region from its descriptor, never through an inherited mapping, so
# a second loader whose workers fork while the first one's ring is pinned
# (a validation loader beside a training one) needs none of those pages.


class Engine:
    """What one Prefetcher or DataLoader runs on. Built in steps, because
    without a spec the workers start before the ring exists (its slots are
    sized from their first batch): ``start_workers``, ``build_ring``,
    ``open_feed``, in whichever order the face needs, and ``close``.

    ``pinning`` makes the face's SlotPinning, attached when the feed opens,
    after the workers have started (NOTE [ The ring is pinned after its
    workers start ]).

    The engine is its feed's owner (FeedOwner in fastq/_loop/_consumer.py): it
    makes batches through the face's BatchMaker, returns slots held for
    device work, and closes on a fatal error, which closes its face.
    """

    def __init__(self, pinning: Callable[[], SlotPinning] | None = None) -> None:
        self.pool: WorkerPool | None = None
        self.region: Region | None = None
        self.ring: Ring | None = None
        self.feed: Feed | None = None
        self.tuner: Autotuner | None = None
        self.pinning: SlotPinning | None = None
        self.batches: BatchMaker | None = None
        self.closed = False
        self._make_pinning = pinning

    # ------------------------------------------------------------ start

    def start_workers(self, ctx: Any, configs: list[Any]) -> WorkerPool:
        """The workers; they get the ring now if it exists, else later
        (WorkerPool.send_region)."""
        self.pool = WorkerPool(ctx, configs, self.ring)
        return self.pool

    def ring_slots(self, slots: int) -> int:
        """The ring's slots for a face's ``slots=``: one more, since the
        batch a `for` loop's body still holds while the next one is fetched
        must not starve the workers; a pinned ring's also hold the batches
        whose device work is still queued (DEVICE_SLOTS)."""
        extra = DEVICE_SLOTS if self._make_pinning is not None else 0
        return min(slots + 1 + extra, MAX_SLOTS)

    def build_ring(
        self, ring_slots: int, workers: int, slot_bytes: int, extra_bytes: int = 0
    ) -> Ring:
        """The region, sized for the ring and ``extra_bytes`` after it (a
        plan table), and the ring at its start."""
        size = region_size(ring_slots, workers, slot_bytes, PAGE_SIZE)
        self.region = Region.create(size + extra_bytes)
        self.ring = Ring.create(
            self.region.mapping, ring_slots, workers, slot_bytes, PAGE_SIZE, SPIN_NS
        )
        return self.ring

    def _slot_ranges(self) -> list[tuple[int, int]]:
        """(offset, nbytes) of each of the ring's slots in its region."""
        assert self.ring is not None and self.region is not None
        base = np.frombuffer(self.region.mapping, dtype=np.uint8).ctypes.data
        ranges = []
        for slot in range(self.ring.nslots):
            view = np.frombuffer(self.ring.slot_view(slot), dtype=np.uint8)
            ranges.append((view.ctypes.data - base, view.nbytes))
        return ranges

    def open_feed(
        self, spec: Any, sampler: Any, batches: BatchMaker, **options: Any
    ) -> Feed:
        """The feed over the ring, once the workers and the ring exist,
        handing out what ``batches`` makes; a page-locked ring is attached
        first."""
        assert self.ring is not None and self.pool is not None
        assert self.region is not None
        if self._make_pinning is not None:
            self.pinning = self._make_pinning()
            # Page-locked pages cannot be collapsed: pinned once settled;
            # slot by slot, first slots first (fastq/torch/_pinned.py).
            self.pinning.attach(
                self.region.mapping, self.region.wait_settled, self._slot_ranges()
            )
        self.region.on_failure(self._memory_failed)
        self.batches = batches
        self.feed = Feed(
            self.ring,
            self.pool,
            spec,
            sampler,
            spin_s=SPIN_NS / 1e9,
            owner=self,
            **options,
        )
        return self.feed

    def _memory_failed(self, failure: SharedMemoryError) -> None:
        """The region's settling thread could not reserve its memory: the
        loop's next batch raises ``failure`` (woken if it waits)."""
        assert self.pool is not None and self.ring is not None
        self.pool.fail(failure)
        self.ring.alert()

    def autotune(self, workers: int) -> None:
        """workers="auto": a controller parks and wakes workers by what the
        loop waits (fastq/_loop/_autotune.py)."""
        feed = self.feed
        assert self.ring is not None and feed is not None
        self.tuner = Autotuner(
            self.ring, workers, lambda: (feed.consumer.delivered, feed.wait_ns)
        )

    # ------------------------------------- what the feed calls (FeedOwner)

    def make_batch(self, arrays: list[np.ndarray[Any, Any]]) -> Any:
        assert self.batches is not None
        return self.batches.make_batch(arrays)

    def unpack(self, lease: SlotLease) -> Any:
        assert self.batches is not None
        return self.batches.unpack(lease)

    def lane_ended(self, lease: SlotLease) -> None:
        assert self.batches is not None
        self.batches.lane_ended(lease)

    def returning_slots(self) -> int:
        """Slots the consumer holds that come back without the loop: a
        pinned ring's, once the GPU has run their device work."""
        return 0 if self.pinning is None else self.pinning.waiting

    def fail(self, exc: BaseException) -> NoReturn:
        """Closes the engine, then raises ``exc``, the error the loop must
        see even if closing raised too (that error is its context)."""
        try:
            self.close()
        finally:
            raise exc

    def held_by_loop(self) -> int:
        """Slots whose batches the loop still references (not those only
        waiting for device work)."""
        assert self.feed is not None
        held = int(self.feed.consumer.held)
        return held - (0 if self.pinning is None else self.pinning.waiting)

    # ------------------------------------------------------------ stop

    def close(self) -> None:
        """Ends every open loop, stops the tuner's thread, waits for device
        copies from the ring and unpins it, closes the ring (which wakes
        every waiter), reaps the workers (bounded), then closes the region's
        descriptor; each step runs even if one before it raised (a Ctrl+C
        that cut the workers' grace short, a CUDA error). The pinning stays
        readable, closed."""
        if self.closed:
            return
        self.closed = True
        if self.feed is not None:
            # The current loop ends with an error, so that a close() from
            # another thread cannot pass for an end.
            self.feed.close_loops(
                "the Prefetcher was closed while this loop was running (by "
                "another thread, or by close() in the loop); create a new one "
                "to go on"
            )
        tuner, self.tuner = self.tuner, None
        try:
            try:
                try:
                    if tuner is not None:
                        tuner.stop()  # no thread of this engine outlives close()
                finally:
                    if self.pinning is not None:
                        self.pinning.close()
            finally:
                # The ring may exist before the pool has it (a DataLoader's,
                # until its region is handed over): closed here either way.
                if self.ring is not None:
                    self.ring.close()
                if self.pool is not None:
                    self.pool.close()
        finally:
            if self.region is not None:
                self.region.close()

    # ------------------------------------------------------------ stats

    def stats(self, slots: int) -> dict[str, Any]:
        """fastq.Prefetcher.stats() (its docstring says what each means)."""
        feed = self.feed
        assert feed is not None
        c = feed.consumer
        n = c.delivered
        elapsed = (time.monotonic_ns() - c.t_first_ns) / 1e9 if n else 0.0
        return {
            "batches": n,
            "bytes": c.delivered_bytes,
            "seconds": elapsed,
            "batches_per_s": n / elapsed if elapsed > 0 else 0.0,
            "gb_per_s": c.delivered_bytes / elapsed / 1e9 if elapsed > 0 else 0.0,
            "wait_share": min(1.0, feed.wait_ns / 1e9 / elapsed)
            if elapsed > 0
            else 0.0,
            "mean_ready": c.occupancy / n if n else 0.0,
            "slots": slots,
            "pages": self.pages(),
            "workers": self._worker_stats(),
            "copied_batches": getattr(self.batches, "copied", 0),
            "autotune": None if self.tuner is None else self.tuner.report(),
            "pinned": None if self.pinning is None else self._pinned_stats(),
        }

    def _pinned_stats(self) -> dict[str, Any]:
        """A pinned ring's counters, and what the loop and the workers lost
        to it: batches copied because the loop kept too many, and the
        workers' time waiting for a free slot."""
        assert self.pinning is not None and self.batches is not None
        stats = self.pinning.stats()
        stats["copied_batches"] = getattr(self.batches, "copied", 0)
        stats["workers_slot_wait_s"] = sum(w["wait_s"] for w in self._worker_stats())
        return stats

    def _worker_stats(self) -> list[dict[str, Any]]:
        if self.pool is None or self.ring is None:
            return []
        held = dict(self.pool.holders())
        stats = []
        for w, pid in enumerate(self.pool.pids):
            batches, busy, wait, _ = self.ring.worker_stats(w)
            stats.append(
                {
                    "pid": pid,
                    "batches": batches,
                    "busy_s": busy / 1e9,
                    "wait_s": wait / 1e9,
                    "task": held.get(w, -1),
                }
            )
        return stats

    def pages(self) -> dict[str, Any]:
        """What backs the ring: its kind, the bytes of it this process maps
        with huge pages (from /proc/self/smaps), and whether its pages are
        settled (collapsed and mapped here; until then both may still
        change)."""
        region = self.region
        if region is None:
            return {"kind": None, "bytes": 0, "huge_bytes": 0, "settled": True}
        return {
            "kind": region.pages,
            "bytes": region.size,
            "huge_bytes": region.huge_bytes(),
            "settled": region.settled.is_set(),
        }
