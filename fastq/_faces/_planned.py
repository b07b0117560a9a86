"""The DataLoader face's side of the engine: packed slots (batches of any
structure) from a dataset whose batches the consumer plans by running a
sampler, as DataLoader's main process does (fastq/_loop/_planner.py), or from an
iterable dataset each worker runs; before the ring exists, first batches
come through the workers' sockets (fastq/_faces/_prober.py)."""

from __future__ import annotations

import copy
import os
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, Callable, Protocol

import numpy as np

from .._core._plan import Plan, PlanLayout
from .._core._ring import SlotLease, region_size
from .._core._shm import PAGE_SIZE
from .._core._turns import Turns
from .._layout._packing import Codec, PackedSpec, unpack
from .._loop._engine import Engine, SlotPinning, in_main_thread
from .._loop._planner import Planner
from .._make._state import StreamResume
from .._make._worker_info import WorkerInfo
from .._workers._config import WorkerConfig
from ..errors import RingError
from ._face import Face
from ._first_batch import claim_kept
from ._prober import FirstBatchProber


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


class PlannedLoader(Face):
    """Workers, ring and plan table for one DataLoader. Iterating it runs
    one epoch of ``batches`` (an iterator of index lists from the sampler,
    given to ``begin_epoch``), or one pass over an iterable source.

    Slots are sized from the first batch a worker makes (every worker
    begins one at once; never made in this process), scaled to
    ``max_rows`` indices, unless
    ``slot_bytes`` is given. ``convert`` converts each batch (pins it);
    ``pinning`` page-locks the ring once it exists, so that its batches are
    pinned as they are.
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
        convert: Callable[[Any], Any] | None = None,
        first_batch: int = 0,
        pinning: Callable[[], SlotPinning] | None = None,
        streams: int = 0,
        stream_resume: StreamResume | None = None,
        skip: frozenset[int] = frozenset(),
    ) -> None:
        self._pid = os.getpid()
        self._closed = True
        self._engine = Engine(pinning)
        self._batches = _PackedBatches(self._engine, source.codec, slots, convert)
        self.ordered = ordered
        # Unordered (or skipping): the number in its epoch of the batch (or
        # error) handed out last, for a state naming the batches delivered.
        self.last_batch = -1
        self.timeout = timeout
        self.workers = workers
        self.slots = slots
        self._ring_slots = self._engine.ring_slots(slots)
        self._entries = max(2 * (slots + 1), 8)
        self._max_bytes = slot_bytes
        self._live = 0  # the current loop's token until the Feed exists
        self._passes = 0
        # An iterable source's lanes (NOTE [ A stream's lanes ] in
        # fastq/_workers/_lanes.py): a resumed state's, else one per worker;
        # in order, their batches come in turn, as DataLoader's in_order
        # gives its workers' (fastq/_core/_turns.py).
        self.streams = 0 if first is not None else streams or workers
        self._stream_resume = stream_resume
        # Until a resumed lane hands out a batch, its place is the state
        # it was resumed from (a state saved then equals the one loaded).
        self._resumed_states: dict[int, Any] = {}
        if stream_resume is not None and stream_resume.states is not None:
            self._resumed_states = {
                v: s for v, s in enumerate(stream_resume.states) if s is not None
            }
        self._turns = first is None and ordered and self.streams > 1
        self._batches.stateful = first is None and bool(
            getattr(source, "stateful", False)
        )
        self._planner: Planner | None = None
        round_: list[Plan] = []
        if first is not None:
            self._planner = Planner(
                first,
                entries=self._entries,
                max_rows=max_rows,
                epoch=epoch,
                first_batch=first_batch,
                ordered=ordered,
                fail=self._engine.fail,
                skip=skip,
            )
            max_rows = self._planner.max_rows
            # Every worker begins at once (NOTE [ The kept first batch ] in
            # fastq/_faces/_first_batch.py), with no more tasks than slots.
            for _ in range(min(workers, self._ring_slots)):
                plan = self._planner.next_plan()
                if plan is None:
                    break
                round_.append(plan)
        self.max_rows = max_rows
        self._first_epoch_pending = first is not None
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
                death_signal=in_main_thread(),
                first_plan=round_[w] if w < len(round_) else None,
                max_rows=max_rows,
                packed=True,
                turns=self._turns,
                streams=self.streams,
                first_pass=0 if stream_resume is None else stream_resume.pass_,
                resume_items=None if stream_resume is None else stream_resume.items,
                resume_states=None if stream_resume is None else stream_resume.states,
            )
            for w in range(workers)
        ]
        # The prober reaches this loader weakly: it is this loader's, and a
        # cycle would keep the loader, and its workers, past its last
        # reference until a collector pass.
        loader = weakref.proxy(self)
        try:
            pool = self._engine.start_workers(ctx, configs)
            self._prober = FirstBatchProber(
                pool,
                self._planner,
                workers=workers,
                timeout=timeout,
                found=lambda spec, kept, worker: loader._build_ring(spec, kept, worker),
                round=round_,
            )
            self._prober.answer()
        except BaseException:
            self._engine.close()
            raise
        # Owned by a DataLoader, which users never close: closed when
        # garbage or at exit without a word (NOTE [ A face left open is
        # closed before the interpreter's teardown ] in fastq/_faces/_face.py).
        self._opened()

    # ---------------------------------------------- before the ring exists

    @property
    def sizing(self) -> bool:
        """No batch has been made yet, so there are no slots: every first
        batch so far raised (each is raised at its turn), or an iterable's
        first workers had nothing. Such an engine serves one epoch or pass;
        the DataLoader starts a new one for the next."""
        return self._engine.feed is None

    def _build_ring(
        self, spec: PackedSpec, kept: list[tuple[int, Plan]], worker: int
    ) -> None:
        """The ring, once ``worker`` made a batch; for a planned source, each
        (worker, task) of ``kept`` is claimed for that worker, which
        delivers the batch (or error) it keeps."""
        engine = self._engine
        assert engine.pool is not None
        if self._max_bytes is not None:
            spec = PackedSpec(self._max_bytes)
        workers = self.workers
        ring_slots = self._ring_slots
        layout = None
        if self._planner is not None:
            ring_bytes = region_size(ring_slots, workers, spec.slot_bytes, PAGE_SIZE)
            layout = PlanLayout.for_batches(ring_bytes, self._entries, self.max_rows)
        ring = engine.build_ring(
            ring_slots,
            max(workers, self.streams),  # an iterable's items count by lane
            spec.slot_bytes,
            0 if layout is None else layout.nbytes,
        )
        assert engine.region is not None
        planner = self._planner
        if planner is not None:
            assert kept and layout is not None
            # Claims start at the kept tasks, claimed here for the workers
            # that made them (NOTE [ The kept first batch ] in
            # fastq/_faces/_first_batch.py), and planned in the table too.
            planner.attach(ring, engine.region.mapping, layout, [p for _, p in kept])
            claim_kept(ring, [(w, p.task) for w, p in kept])
        feed = engine.open_feed(
            spec,
            None,
            self._batches,
            ordered=self.ordered,
            timeout=self.timeout,
            copy=False,
            fatal_errors=False,
            indices_of=None if planner is None else planner.indices.get,
            streams=self.streams,
        )
        feed.live = self._live  # the current loop goes on over the ring
        resume = self._stream_resume
        if resume is not None:
            feed.passes.resume_at(resume)
        if self._turns:
            used = self._prober.turns_used
            feed.turns = Turns(
                ring,
                feed.consumer,
                [
                    (0 if resume is None else resume.items[v])
                    + (used[v] if v < workers else 0)
                    for v in range(self.streams)
                ],
            )
        if planner is not None:
            feed.consumer.next_task = kept[0][1].task
            self._fill()
        engine.pool.send_region(
            engine.region,
            engine.region.size,
            spec,
            ring,
            layout,
            kept=[p.task for _, p in kept],
        )

    def _handed(self) -> int:
        """Batches (and errors) handed out so far, over every epoch."""
        feed = self._engine.feed
        handed = 0 if feed is None else feed.consumer.handed
        return self._prober.handed + handed

    # ------------------------------------------------------------ epochs

    def _fill(self) -> None:
        assert self._planner is not None and self._engine.feed is not None
        self._planner.fill(self._engine.feed.consumer.next_task)

    def begin_epoch(
        self,
        batches: Iterator[Sequence[Any]],
        epoch: int,
        first_batch: int = 0,
        skip: frozenset[int] = frozenset(),
    ) -> Iterator[Any]:
        """One epoch over ``batches`` (the sampler's index lists), whose
        first is the epoch's batch ``first_batch``, dropping the batches
        numbered in ``skip`` (delivered out of order before a resumed
        state)."""
        self._check_open()
        planner = self._planner
        assert planner is not None
        if self._first_epoch_pending:
            # The constructor planned this epoch's start already.
            self._first_epoch_pending = False
        else:
            if self.sizing:
                raise RuntimeError("an engine still sizing its slots serves one epoch")
            feed, ring = self._engine.feed, self._engine.ring
            assert feed is not None and ring is not None
            start = planner.begin(batches, epoch, first_batch, skip)
            # Tasks claimed past the plan wait for this epoch's plans; the
            # abandoned epoch's unclaimed ones are skipped, and whatever of
            # it is in flight is dropped when it arrives.
            ring.skip_tasks_to(start)
            c = feed.consumer
            c.pending = -1
            c.next_task = start
            c.drop_below(start)
            self._fill()
        feed = self._engine.feed
        if feed is not None:
            feed.live += 1
            token = feed.live
        else:
            self._live += 1
            token = self._live
        return _PlannedEpochIterator(self, token, self._handed())

    def next_in_epoch(self, token: int, handed0: int) -> Any:
        """The epoch's next batch for the loop ``token``, which began with
        ``handed0`` handed out; StopIteration at its end."""
        feed = self._engine.feed
        if feed is None:  # sizing: no batch made yet
            self.next_before_ring()
            feed = self._engine.feed
        planner = self._planner
        assert feed is not None and planner is not None
        if token != feed.live:
            feed.check_closed(token)  # closed while this loop ran
            raise StopIteration
        c = feed.consumer
        planner.fill(c.next_task)
        done = c.handed + self._prober.handed - handed0 + planner.epoch_first
        if done + planner.skipped >= planner.epoch_count and planner.exhausted:
            raise StopIteration
        lease = feed.next_lease(planner.epoch_start, planner.planned)
        task = lease.task
        if planner.numbers:
            self.last_batch = planner.numbers.pop(task, -1)
        try:
            batch = feed.hand_out(lease)
        finally:
            planner.indices.pop(task, None)
        c.pending = -1  # handed out: an attribute store, then straight out
        return batch

    def __iter__(self) -> Iterator[Any]:
        self._check_open()
        if self._planner is not None:
            raise TypeError("a planned source is iterated with begin_epoch()")
        feed = self._engine.feed
        batches = self._batches
        lane_states = batches.lane_states
        # A new pass: no state yet, but where a lane's copy ended the last
        # pass (persistent workers), it starts this one from that state;
        # or from the one resumed.
        lane_states.clear()
        lane_states.update(batches.ended_states)
        batches.ended_states.clear()
        lane_states.update(self._resumed_states)
        self._resumed_states = {}
        if feed is not None:
            return feed.begin_pass(self)  # it holds this face, as each loop
        if self._passes:
            raise RuntimeError("an engine still sizing its slots serves one pass")
        self._passes += 1
        return _PassBeforeRing(self)

    def lane_states(self) -> list[Any] | None:
        """A stateful iterable's: each lane's dataset state after its last
        batch handed out in this pass (None where none was); else None."""
        if not self._batches.stateful:
            return None
        states = self._batches.lane_states
        return [states.get(v) for v in range(self.streams)]

    def next_before_ring(self) -> None:
        """The next item while sizing (FirstBatchProber.next_item): a first
        batch's error, StopIteration, or a return once the ring exists."""
        self._check_open()
        self._prober.next_item(lambda: self.sizing)

    def __len__(self) -> int:
        raise TypeError("a DataLoader's engine has no len(); ask the DataLoader")

    # ---------------------------------------------------------- lifecycle

    @property
    def inherited(self) -> bool:
        """This process is a forked copy of the one that started the engine
        (accelerate's notebook_launcher forks with the loader): the workers
        and slots are the parent's, for it neither to use nor to close."""
        return os.getpid() != self._pid

    def stats(self) -> dict[str, Any]:
        """fastq.Prefetcher.stats(); empty while no batch has been made."""
        return {} if self.sizing else self._engine.stats(self.slots)

    # The engine's parts, as the DataLoader and the tests reach them.

    @property
    def _pool(self) -> Any:
        return self._engine.pool

    @property
    def _region(self) -> Any:
        return self._engine.region

    @property
    def _ring(self) -> Any:
        return self._engine.ring

    @property
    def _feed(self) -> Any:
        return self._engine.feed


class _PackedBatches:
    """A packed slot's batch as the loop gets it: rebuilt over the slot,
    held for device work when the ring is pinned, copied out once the loop
    keeps too many, converted (pinned) by ``convert``. A DataLoader's slots
    hold packed batches only."""

    def __init__(
        self,
        engine: Engine,
        codec: Codec,
        slots: int,
        convert: Callable[[Any], Any] | None,
    ) -> None:
        self._engine = weakref.proxy(engine)  # its owner: no cycle
        self._codec = codec
        # Batches alive at a hand-out before the rest are copied: a `for`
        # loop has two then (the body's last one and the new one), three if
        # it keeps the previous one; one slot always stays for the workers.
        self._keep_limit = max(3, slots)
        self._convert = convert
        self.copied = 0  # batches copied because the loop kept too many
        # A stateful iterable's batches come as (batch, its dataset's state
        # after it): each lane's latest state handed out, for a checkpoint.
        self.stateful = False
        self.lane_states: dict[int, Any] = {}
        # Its state as each lane's iterator ended in this pass (carried by
        # the end marker), where the lane's next pass starts.
        self.ended_states: dict[int, Any] = {}

    def make_batch(self, arrays: list[np.ndarray[Any, Any]]) -> Any:
        raise RingError("a DataLoader's slots hold packed batches only")

    def unpack(self, lease: SlotLease) -> Any:
        slot = np.frombuffer(memoryview(lease), dtype=np.uint8)
        batch = unpack(slot, lease.payload_bytes, self._codec)
        if self.stateful:
            batch, self.lane_states[lease.worker] = batch
        engine = self._engine
        pinning = engine.pinning
        if engine.held_by_loop() >= self._keep_limit:
            # The loop keeps its batches (list(loader), a running list of
            # outputs): from here on each batch is copied and its slot
            # returned at once, so the workers never run out of slots.
            copied = self._copied(batch)
            if copied is not batch:
                self.copied += 1
                batch = copied
                pinning = None  # nothing handed out reads the slot
        if pinning is not None:
            pinning.hold(slot, lease)
        del slot
        if self._convert is not None:
            return self._convert(batch)
        return batch

    def lane_ended(self, lease: SlotLease) -> None:
        """A stateful iterable's state as a lane's iterator ended: the
        lane's place from now on (copied: the slot goes back to the
        workers)."""
        if not self.stateful:
            return
        slot = np.frombuffer(memoryview(lease), dtype=np.uint8)
        state = copy.deepcopy(unpack(slot, lease.payload_bytes, self._codec))
        del slot
        self.lane_states[lease.worker] = self.ended_states[lease.worker] = state

    def _copied(self, batch: Any) -> Any:
        # Silently, as DataLoader keeps batches silently: a warning here
        # would fail a user's `-W error` run of `torch.cat(list(loader))`;
        # stats()["copied_batches"] counts them.
        try:
            return copy.deepcopy(batch)
        except Exception:  # an object that cannot be copied: keep the views
            return batch


class _PlannedEpochIterator:
    """One epoch of planned batches. Like _EpochIterator, usable after an
    exception inside ``__next__``; a worker's exception ends its batch,
    not the epoch."""

    __slots__ = ("_handed0", "_loader", "_token")

    def __init__(self, loader: PlannedLoader, token: int, handed0: int) -> None:
        self._loader = loader
        self._token = token
        self._handed0 = handed0

    def __iter__(self) -> _PlannedEpochIterator:
        return self

    def __next__(self) -> Any:
        return self._loader.next_in_epoch(self._token, self._handed0)


class _PassBeforeRing:
    """An iterable source's first pass while no worker has made a batch:
    raises the first batches' errors, then goes on over the ring."""

    __slots__ = ("_it", "_loader")

    def __init__(self, loader: PlannedLoader) -> None:
        self._loader = loader
        self._it: Iterator[Any] | None = None

    def __iter__(self) -> _PassBeforeRing:
        return self

    def __next__(self) -> Any:
        if self._it is None:
            loader = self._loader
            if loader.sizing:
                loader.next_before_ring()
            self._it = loader._feed.begin_pass(loader)
        return next(self._it)


__all__ = ["PackedSource", "PlannedLoader"]
