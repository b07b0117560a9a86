"""The engine behind a DataLoader: packed slots (batches of any structure)
from a dataset whose batches the consumer plans by running a sampler, as
DataLoader's main process does, or from an iterable dataset each worker
runs. Lifecycle, stats and the wait for a batch are the Prefetcher's."""

from __future__ import annotations

import contextlib
import copy
import os
import warnings
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any, Callable, Protocol

import numpy as np

from . import _report
from ._consumer import Feed
from ._diagnosis import batch_error
from ._first_batch import claim_kept
from ._packing import Codec, PackedSpec, unpack
from ._plan import Plan, PlanLayout, PlanTable
from ._pool import WorkerPool
from ._prefetcher import _SPIN_NS, Prefetcher, _in_main_thread
from ._ring import MAX_SLOTS, Ring, SlotLease, region_size
from ._shm import PAGE_SIZE, Region
from ._turns import Turns
from ._worker import WorkerConfig
from ._worker_info import WorkerInfo
from .errors import ConfigError


class PackedSource(Protocol):
    """What a worker runs for a packed source (pickled into each worker).

    ``start_worker`` runs once in each worker before ``worker_init``;
    ``reseed(seed)`` before each planned batch; ``make(indices)`` makes a
    planned batch, with ``position`` naming the index being made (-1: none
    in particular); ``__call__()`` returns an iterator of batches for an
    iterable source. ``codec`` lays the batch's leaves into the slot."""

    codec: Codec
    position: int

    def start_worker(self, info: WorkerInfo) -> None: ...
    def reseed(self, seed: int) -> None: ...
    def make(self, indices: Sequence[Any]) -> Any: ...
    def __call__(self) -> Iterator[Any]: ...


class SlotPinning(Protocol):
    """A page-locked ring (fastq/torch/_pinned.py): registered once the
    ring exists, it keeps a released slot until the device work that may
    still read it has run."""

    @property
    def waiting(self) -> int: ...
    def register(self, mapping: Any) -> None: ...
    def hold(self, whole: np.ndarray[Any, Any], lease: Any) -> None: ...
    def make_room(self, consumer: Any, nslots: int) -> None: ...
    def close(self) -> None: ...


class PlannedPrefetcher(Prefetcher):
    """Workers, ring and plan table for one DataLoader. Iterating it runs
    one epoch of ``batches`` (an iterator of index lists from the sampler,
    given to ``begin_epoch``), or one pass over an iterable source.

    Slots are sized from worker 0's first batch (task 0 of the first epoch,
    never made in this process), scaled to ``max_rows`` indices, unless
    ``slot_bytes`` is given. ``make_batch`` converts each batch (pins it);
    ``pinning``, called once the ring exists, page-locks it, so that its
    batches are pinned as they are.
    """

    def __init__(
        self,
        source: PackedSource,
        *,
        ctx: Any,
        workers: int,
        slots: int,
        seed: int,
        first: Iterator[Sequence[Any]] | None,
        epoch: int,
        max_rows: int,
        ordered: bool,
        timeout: float | None,
        worker_init: Callable[[int], Any] | None,
        worker_threads: int | None,
        slot_bytes: int | None,
        rank: int,
        world_size: int,
        make_batch: Callable[[Any], Any] | None = None,
        first_batch: int = 0,
        pinning: Callable[[], SlotPinning] | None = None,
    ) -> None:
        self._pid = os.getpid()
        self._closed = True
        self._pool: WorkerPool | None = None
        self._region: Region | None = None
        self._sampler = None
        self._is_map = first is not None
        self._codec = source.codec
        # Batches alive at a hand-out before the rest are copied: a `for`
        # loop has two then (the body's last one and the new one), three if
        # it keeps the previous one; one slot always stays for the workers.
        self._keep_limit = max(3, slots)
        self._warned_keeping = False
        self._convert = make_batch
        self._make_pinning = pinning
        self._pinning: SlotPinning | None = None
        self.ordered = ordered
        self.copy = False
        self.timeout = timeout
        self.workers = workers
        self.slots = slots
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        # The plan: index lists taken from the sampler but not yet written.
        self._ahead: deque[Sequence[Any]] = deque()
        self._epoch_batches: Iterator[Sequence[Any]] | None = first
        self._exhausted = False  # the epoch's sampler has run out
        self._entries = max(2 * (slots + 1), 8)
        self._planned = 0  # next task to plan
        self._epoch = epoch
        self._epoch_start = 0
        # The epoch's batches planned, counted from its first (a resumed
        # epoch starts at first_batch: those before it were delivered).
        self._epoch_first = first_batch
        self._epoch_count = first_batch
        self._planned_indices: dict[int, Sequence[Any]] = {}
        self._max_bytes = slot_bytes
        # Until the ring exists: which worker is making a first batch (and
        # of which task), the error it answered, and the errors handed out.
        self._sized = False  # the ring and its Feed exist
        self._asked: int | None = None  # worker whose answer is due
        self._asked_plan: Plan | None = None  # the task whose answer is due
        self._probed = 0  # the worker asked last
        # An iterable source's workers whose stream has not ended, and
        # those asked already (the others start theirs afresh when asked).
        self._streams = set(range(workers))
        self._started = {0}
        self._early_error: Exception | None = None
        self._early_handed = 0
        self._ended = False  # no first batch is left to ask for
        self._live = 0  # the current loop's token until the Feed exists
        self._passes = 0
        # An iterable source in order: the workers' batches come in turn,
        # as DataLoader's in_order gives them (fastq/_turns.py); each
        # worker's turns used before the ring by first batches that failed.
        self._turns = first is None and ordered and workers > 1
        self._early_turns = [0] * workers
        first_plan = None
        if first is not None:
            self._take_ahead(self._entries)
            if not self._ahead:
                raise ValueError("an empty epoch needs no workers")
            max_rows = max(max_rows, *(len(b) for b in self._ahead))
        self.max_rows = max_rows
        if first is not None:
            first_plan = self._next_plan()

        configs = [
            WorkerConfig(
                worker_id=w,
                num_workers=workers,
                source=source,
                is_map=first is not None,
                spec=None,
                sampler=None,
                seed=seed,
                rank=rank,
                world_size=world_size,
                worker_init=worker_init,
                region=None,
                region_size=0,
                consumer_pid=self._pid,
                threads=worker_threads,
                death_signal=_in_main_thread(),
                first_plan=first_plan if w == 0 else None,
                max_rows=max_rows,
                packed=True,
                turns=self._turns,
            )
            for w in range(workers)
        ]
        try:
            self._pool = WorkerPool(ctx, configs, None)
            self._asked = 0
            self._asked_plan = first_plan
            self._first_epoch_pending = first is not None
            self._answer()
        except BaseException:
            self._teardown()
            raise
        self._closed = False

    # ---------------------------------------------- before the ring exists

    @property
    def sizing(self) -> bool:
        """No batch has been made yet, so there are no slots: every first
        batch so far raised (each is raised at its turn), or an iterable's
        first workers had nothing. Such an engine serves one epoch or pass;
        the DataLoader starts a new one for the next."""
        return not self._sized

    def _next_plan(self) -> Plan | None:
        """The epoch's next batch, planned as a task (None: epoch over)."""
        self._take_ahead(1)
        if not self._ahead:
            return None
        indices = self._ahead.popleft()
        self._check_rows(indices)
        task = self._planned
        self._planned += 1
        self._planned_indices[task] = indices
        self._epoch_count += 1
        return Plan(task, self._epoch, self._epoch_count - 1, list(indices))

    def _ask(self) -> bool:
        """Asks for the next first batch (a planned source's next task, or
        the next item of an iterable's next worker in turn, as DataLoader
        takes them); False if there is none to ask."""
        payload: Any
        if self._is_map:
            payload = self._next_plan()
            if payload is None:
                return False
            self._asked_plan = payload
        else:
            after = self._probed
            turn = ((after + k) % self.workers for k in range(1, self.workers + 1))
            worker = next((w for w in turn if w in self._streams), None)
            if worker is None:
                return False
            payload = worker not in self._started  # its stream starts now
            self._started.add(worker)
            self._probed = worker
        assert self._pool is not None
        self._pool.ask_first(self._probed, payload)
        self._asked = self._probed
        return True

    def _answer(self, initial: bool = True) -> None:
        """Waits for the answer due, and acts on it: builds the ring from a
        spec; keeps a batch's error to raise at its turn; asks the next
        worker when an iterable worker has nothing. No worker with anything
        ends the pass, or (``initial``: nothing was raised yet) raises the
        ConfigError that says the source is empty."""
        pool = self._pool
        assert pool is not None
        while True:
            worker, held = self._asked, self._asked_plan
            task = -1 if held is None else held.task
            assert worker is not None
            kind, payload = pool.receive_first(worker, self.timeout)
            self._asked = None
            if kind == "spec":
                self._build_ring(payload, held, worker)
                return
            if kind == "error":
                if not self._is_map:
                    self._early_turns[worker] += 1
                report, position = payload
                self._early_error = batch_error(
                    _report.decode(report),
                    worker=worker,
                    pid=pool.pids[worker],
                    task=task,
                    position=position,
                    indices=self._planned_indices.pop(task, None),
                )
                return
            if kind == "empty":  # an iterable worker with nothing (more)
                self._streams.discard(worker)
                if self._ask():
                    continue
                if initial:
                    raise pool.empty_error()
                self._ended = True
                return
            raise _report.decode(payload).error(  # worker_init failed
                worker=worker, pid=pool.pids[worker], where="its worker_init_fn"
            )

    def _next_before_ring(self) -> None:
        """The epoch's (or pass's) next item while sizing: raises the next
        first batch's error, or StopIteration when the epoch is over;
        returns once the ring exists."""
        while self.sizing:
            if self._early_error is not None:
                self._early_handed += 1
                if not self._ended:
                    self._ask()  # the next one is made while this is handled
                error, self._early_error = self._early_error, None
                try:
                    raise error
                finally:
                    del error  # no cycle through this frame
            if self._asked is None and (self._ended or not self._ask()):
                self._ended = True
                raise StopIteration
            self._answer(initial=False)

    def _build_ring(self, spec: PackedSpec, held: Plan | None, worker: int) -> None:
        """The ring, once ``worker`` made a batch (of task ``held``, for a
        planned source: the task is claimed for that worker, which delivers
        the batch it keeps)."""
        assert self._pool is not None
        if self._max_bytes is not None:
            spec = PackedSpec(self._max_bytes)
        self._spec = spec  # type: ignore[assignment]
        workers = self.workers
        ring_slots = min(self.slots + 1, MAX_SLOTS)
        ring_bytes = region_size(ring_slots, workers, spec.slot_bytes, PAGE_SIZE)
        plan = None
        size = ring_bytes
        if self._is_map:
            plan = PlanLayout.for_batches(ring_bytes, self._entries, self.max_rows)
            size += plan.nbytes
        self._region = Region.create(size)
        ring = self._ring = Ring.create(
            self._region.mapping,
            ring_slots,
            workers,
            spec.slot_bytes,
            PAGE_SIZE,
            _SPIN_NS,
        )
        self._plans: PlanTable | None = None
        self._sized = True
        if self._make_pinning is not None:
            self._pinning = self._make_pinning()
            self._pinning.register(self._region.mapping)
        if plan is not None:
            assert held is not None
            self._plans = PlanTable(ring, self._region.mapping, plan)
            # Tasks before the held one were planned (and failed) through
            # the workers' sockets; claims start at the held one, claimed
            # here for the worker that made it (NOTE [ The kept first
            # batch ] in fastq/_first_batch.py), planned in the table too.
            self._plans.write(held.task, held.epoch, held.batch, held.indices)
            claim_kept(ring, worker, held.task)
            ring.set_planned(held.task + 1)
        feed = self._feed = Feed(
            ring,
            self._pool,
            self._spec,
            None,
            ordered=self.ordered,
            timeout=self.timeout,
            copy=False,
            spin_s=_SPIN_NS / 1e9,
            owner=self,
            fatal_errors=False,
            indices_of=self._planned_indices.get,
        )
        feed.live = self._live  # the current loop goes on over the ring
        if self._turns:
            feed.turns = Turns(ring, feed.consumer, self._early_turns)
        if plan is not None:
            assert held is not None
            feed.consumer.next_task = held.task
            self._fill()
        self._pool.send_region(self._region, self._region.size, spec, ring, plan)

    def _check_rows(self, indices: Sequence[Any]) -> None:
        if len(indices) > self.max_rows:
            self.fail(
                ConfigError(
                    f"the sampler's batch {self._epoch_count} of epoch "
                    f"{self._epoch} has {len(indices)} indices, more than "
                    f"the {self.max_rows} slots were sized for (the "
                    "largest of the first batches it gave); pass "
                    f"max_batch_size={len(indices)} or more"
                )
            )

    def _handed(self) -> int:
        """Batches (and errors) handed out so far, over every epoch."""
        handed = self._feed.consumer.handed if self._sized else 0
        return self._early_handed + handed

    # ------------------------------------------------------------ planning

    def _take_ahead(self, n: int) -> None:
        it = self._epoch_batches
        while it is not None and len(self._ahead) < n:
            try:
                self._ahead.append(next(it))
            except StopIteration:
                self._epoch_batches = None
                self._exhausted = True
                return

    def _fill(self) -> None:
        """Plans the epoch's next batches, as far as the table allows: task
        t only once task t - entries is done with (handed out or dropped)."""
        plans = self._plans
        assert plans is not None
        limit = self._feed.consumer.next_task + self._entries
        if not self.ordered and self._planned_indices:
            limit = min(self._planned_indices) + self._entries
        task = self._planned
        while task < limit:
            if not self._ahead:
                self._take_ahead(1)
                if not self._ahead:
                    break
            indices = self._ahead.popleft()
            self._check_rows(indices)
            plans.write(task, self._epoch, self._epoch_count, indices)
            self._planned_indices[task] = indices
            self._epoch_count += 1
            task += 1
        if task != self._planned:
            self._planned = task
            self._ring.set_planned(task)

    def begin_epoch(
        self, batches: Iterator[Sequence[Any]], epoch: int, first_batch: int = 0
    ) -> Iterator[Any]:
        """One epoch over ``batches`` (the sampler's index lists), whose
        first is the epoch's batch ``first_batch``."""
        self._check_open()
        if self._first_epoch_pending:
            # The constructor planned this epoch's start already.
            self._first_epoch_pending = False
        else:
            if self.sizing:
                raise RuntimeError("an engine still sizing its slots serves one epoch")
            c = self._feed.consumer
            start = self._planned
            # Tasks claimed past the plan wait for this epoch's plans; the
            # abandoned epoch's unclaimed ones are skipped, and whatever of
            # it is in flight is dropped when it arrives.
            self._ring.skip_tasks_to(start)
            c.pending = -1
            c.next_task = start
            c.drop_below(start)
            self._planned_indices.clear()
            self._ahead.clear()
            self._epoch_batches = batches
            self._exhausted = False
            self._epoch = epoch
            self._epoch_start = start
            self._epoch_first = first_batch
            self._epoch_count = first_batch
            self._fill()
        if self._sized:
            self._feed.live += 1
            token = self._feed.live
        else:
            self._live += 1
            token = self._live
        return _PlannedEpochIterator(self, token, self._handed())

    def __iter__(self) -> Iterator[Any]:
        self._check_open()
        if self._is_map:
            raise TypeError("a planned source is iterated with begin_epoch()")
        if not self.sizing:
            return self._feed.begin_pass()
        if self._passes:
            raise RuntimeError("an engine still sizing its slots serves one pass")
        self._passes += 1
        return _PassBeforeRing(self)

    def stats(self) -> dict[str, Any]:
        """The Prefetcher's stats; empty while no batch has been made."""
        return {} if self.sizing else super().stats()

    def __len__(self) -> int:
        raise TypeError("a DataLoader's engine has no len(); ask the DataLoader")

    def __del__(self) -> None:
        # Owned by a DataLoader, which users never close: no warning.
        if not getattr(self, "_closed", True) and os.getpid() == self._pid:
            with contextlib.suppress(Exception):
                self.close()

    # ------------------------------------------------------------- batches

    def unpack(self, lease: SlotLease) -> Any:
        slot = np.frombuffer(memoryview(lease), dtype=np.uint8)
        batch = unpack(slot, lease.payload_bytes, self._codec)
        pinning = self._pinning
        held = self._feed.consumer.held
        if pinning is not None:
            pinning.hold(slot, lease)
            held -= pinning.waiting
        del slot
        if held >= self._keep_limit:
            # The loop keeps its batches (list(loader), a running list of
            # outputs): from here on each batch is copied and its slot
            # returned at once, so the workers never run out of slots.
            batch = self._copied(batch)
        if self._convert is not None:
            return self._convert(batch)
        return batch

    def reclaim_slots(self) -> None:
        if self._pinning is not None:
            self._pinning.make_room(self._feed.consumer, self._ring.nslots)

    def _teardown(self) -> None:
        # Copies queued from the ring finish before it is unpinned, and it
        # is unpinned before it is unmapped.
        pinning = getattr(self, "_pinning", None)
        self._pinning = None
        try:
            if pinning is not None:
                pinning.close()
        finally:
            super()._teardown()

    def _copied(self, batch: Any) -> Any:
        if not self._warned_keeping:
            self._warned_keeping = True
            warnings.warn(
                f"{self._feed.consumer.held} batches are still referenced, of "
                f"the {self._ring.nslots} slots: from now on batches are "
                "copied out of the ring (slower). If you keep batches on "
                "purpose, raise slots=; if not, drop references to old ones",
                RuntimeWarning,
                stacklevel=4,
            )
        try:
            return copy.deepcopy(batch)
        except Exception:  # an object that cannot be copied: keep the views
            return batch


class _PlannedEpochIterator:
    """One epoch of planned batches. Like _EpochIterator, usable after an
    exception inside ``__next__``; a worker's exception ends its batch,
    not the epoch."""

    __slots__ = ("_engine", "_handed0", "_token")

    def __init__(self, engine: PlannedPrefetcher, token: int, handed0: int) -> None:
        self._engine = engine
        self._token = token
        self._handed0 = handed0

    def __iter__(self) -> _PlannedEpochIterator:
        return self

    def __next__(self) -> Any:
        engine = self._engine
        if not engine._sized:
            engine._check_open()
            engine._next_before_ring()
        feed = engine._feed
        if self._token != feed.live:
            feed.check_closed(self._token)  # closed while this loop ran
            raise StopIteration
        engine._fill()
        c = feed.consumer
        done = c.handed + engine._early_handed - self._handed0 + engine._epoch_first
        if done >= engine._epoch_count and engine._exhausted:
            raise StopIteration
        lo = engine._epoch_start
        lease = feed.next_lease(lo, engine._planned)
        task = lease.task
        try:
            batch = feed.hand_out(lease)
        finally:
            engine._planned_indices.pop(task, None)
        c.pending = -1  # handed out: an attribute store, then straight out
        return batch


class _PassBeforeRing:
    """An iterable source's first pass while no worker has made a batch:
    raises the first batches' errors, then goes on over the ring."""

    __slots__ = ("_engine", "_it")

    def __init__(self, engine: PlannedPrefetcher) -> None:
        self._engine = engine
        self._it: Iterator[Any] | None = None

    def __iter__(self) -> _PassBeforeRing:
        return self

    def __next__(self) -> Any:
        if self._it is None:
            engine = self._engine
            if engine.sizing:
                engine._check_open()
                engine._next_before_ring()
            self._it = engine._feed.begin_pass()
        return next(self._it)


__all__ = ["PackedSource", "PlannedPrefetcher"]
