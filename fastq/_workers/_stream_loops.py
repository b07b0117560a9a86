"""A worker's loop for a stream source (an iterable, a generator function):
its items as whole batches, as packed batches, or as samples gathered into
batches; ordered streams in turns."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .._core._report import UNKNOWN_SAMPLE
from .._core._ring import SLOT_BATCH, SLOT_END, Ring
from .._core._turns import turn_task
from .._layout._jagged import JaggedArray
from .._layout._packing import Codec, pack
from .._layout._rows import RowWriter, copy_rows
from .._make._streams import ShuffleBuffer
from .._make._worker_info import WorkerInfo
from ._lanes import Lane, Lanes, resume_source
from ._worker_loops import First, Producer, field_views, slot_arrays
from ._worker_setup import NOTHING, open_stream

if TYPE_CHECKING:
    from ._config import WorkerConfig


class _Stream(Producer):
    """A stream source (fastq._make._streams), read in passes: the consumer
    starts each, and this worker opens its lanes' streams afresh for it
    (NOTE [ A stream's lanes ] in fastq/_workers/_lanes.py), ends each
    with an end marker, and waits for the next. A kind makes a batch from
    a lane's stream (``_make``) and says what an error in it means
    (``_failed``); the slots come in the ring's order, or in turns."""

    keeps_first_plan = False

    def __init__(self, ring: Ring, cfg: WorkerConfig, info: WorkerInfo) -> None:
        super().__init__(ring, cfg, info)
        self.lanes = Lanes(cfg, info)
        self._init_error: BaseException | None = None

    def _item_of(self) -> int:
        lane = self.lanes.current
        return self.wid if lane is None else lane.id

    def _make(self, lane: Lane, item: Any, slot: int) -> tuple[int, int]:
        """The next batch from the lane's stream (`item` first, unless
        NOTHING) into slot: (rows, or a packed batch's arena bytes; its
        record bytes). Raises StopIteration once the pass has nothing more
        for it."""
        raise NotImplementedError

    def _end_of_lane(self, lane: Lane, slot: int) -> tuple[int, int]:
        """What the end marker of the lane's pass carries in its slot, as
        ``_make``'s sizes: here nothing."""
        return 0, 0

    def _failed(self, slot: int, exc: Exception, lane: Lane, pass_: int) -> bool:
        """Reports exc in place of the slot's batch: whether the lane's
        pass goes on after it (here: it ends there)."""
        self._report(slot, exc, 0, pass_)
        return False

    def run(self, first: First) -> None:
        """`first`: the iterator and first item (a batch, or a sample of a
        sample stream) that inferred the spec, its first lane's."""
        ring = self.ring
        cfg = self.cfg
        lanes = self.lanes
        make = self._make
        # `first`, its open iterator and a state's items belong to the
        # ring's pass 0, whatever pass the consumer has reached by the time
        # this worker starts (a slow worker_init, a `break` meanwhile): a
        # later pass opens fresh streams and resumes nothing.
        pass_ = 0
        lanes.begin_pass(0)
        if first is not None and lanes.lanes:
            lanes.lanes[0].it, lanes.lanes[0].held = first
        while True:
            lane, slot, current, wait_ns = self._take(pass_)
            if slot < 0:
                return
            t0 = time.perf_counter_ns()
            if current != pass_:
                pass_ = current
            lanes.enter(lane)
            try:
                if self._init_error is not None:
                    self._stop_lane(slot, lane, pass_)
                    continue
                if lane.state is not None:
                    resume_source(lane)
                if lane.it is None:
                    lane.it = open_stream(cfg, pass_, lane.id, lane.pass_source)
                if lane.skip:
                    skip, lane.skip = lane.skip, 0
                    lane.drawn = skip
                    if lane.held is not NOTHING:
                        lane.held, skip = NOTHING, skip - 1
                    pass_over(lane.it, skip)
                item, lane.held = lane.held, NOTHING
                rows, record = make(lane, item, slot)
            except StopIteration:
                lane.live = False
                size, record = self._end_of_lane(lane, slot)
                if not ring.publish(slot, SLOT_END, size, pass_, lane.id, 0, record):
                    return
                continue
            except Exception as exc:
                if not self._failed(slot, exc, lane, pass_):
                    # The error ends the lane's pass. A loop that stopped
                    # before reaching it (a `break`) starts another pass:
                    # the lane joins it with a fresh iterator.
                    lane.live = False
                continue
            ring.batch_done(self.wid, time.perf_counter_ns() - t0, wait_ns)
            if not ring.publish(slot, SLOT_BATCH, rows, pass_, lane.id, 0, record):
                return

    def _stop_lane(self, slot: int, lane: Lane, pass_: int) -> None:
        """A worker_init that failed, in place of the lane's items: its
        error in the first lane's first slot, then (in turns) an end
        marker in each lane's next, so the pass ends in order."""
        assert self._init_error is not None
        first = lane is self.lanes.lanes[0]
        if first and not lane.reported:
            lane.reported = True
            self._report(slot, self._init_error, UNKNOWN_SAMPLE, pass_)
            if not self.cfg.turns:
                # Without turns the error ends this worker's pass.
                for other in self.lanes.lanes:
                    other.live = False
            return
        lane.live = False
        self.ring.publish(slot, SLOT_END, 0, pass_, lane.id)

    def _take(self, pass_: int) -> tuple[Lane, int, int, int]:
        """(lane, slot, the ring's pass, wait_ns) for the next item this
        worker makes; slot < 0 once the ring is closed. A new pass begins
        every lane afresh; with no live lane left, it waits for one."""
        ring = self.ring
        lanes = self.lanes
        turns = self.cfg.turns
        t0 = time.perf_counter_ns()
        while True:
            current = ring.pass_
            if current != pass_:
                pass_ = current
                lanes.begin_pass(pass_)
            lane = lanes.next_lane(turns)
            if lane is None:
                if not self._wait_for_next_pass(pass_):
                    return _NO_LANE, -1, pass_, 0
                continue
            if not turns:
                slot = ring.pop_free(self.wid)
                if slot < 0:
                    return lane, slot, pass_, 0
                if ring.pass_ != pass_:
                    # The slot serves the new pass's first item instead.
                    pass_ = ring.pass_
                    lanes.begin_pass(pass_)
                    lane = lanes.next_lane(turns)
                    assert lane is not None
                ring.claim_task(slot)
                return lane, slot, pass_, time.perf_counter_ns() - t0
            # The task is granted before a slot is taken, so a worker holds
            # no slot while it waits for its turn (fastq/_core/_turns.py).
            task = turn_task(pass_, lane.turn, lane.id, lanes.count)
            if not ring.wait_planned(task):
                return lane, -1, pass_, 0
            if ring.pass_ != pass_:
                continue  # a new pass's grant woke it: its first turns then
            slot = ring.pop_free(self.wid)
            if slot < 0:
                return lane, slot, pass_, 0
            ring.record_task(slot, task)
            lane.turn += 1
            return lane, slot, pass_, time.perf_counter_ns() - t0

    def _wait_for_next_pass(self, pass_: int) -> bool:
        """Sleeps until the consumer starts another pass; False if closed."""
        ring = self.ring
        while True:
            seen = ring.control
            if ring.closed:
                return False
            if ring.pass_ != pass_:
                return True
            ring.wait_control(seen, 1.0)

    def report_and_stop(self, exc: BaseException) -> None:
        """Reports a failure outside any batch (worker_init) in each pass,
        in place of the first lane's first item: a pass that a `break`
        abandoned before the report must not leave the next one waiting
        for this worker's end of stream. Returns once the ring closes."""
        self._init_error = exc
        self.run(None)


_NO_LANE = Lane(-1, None, None, None)  # type: ignore[arg-type]


class BatchStream(_Stream):
    """A stream of whole batches, each copied into the slot's field arrays.
    An error ends this worker's pass."""

    def __init__(self, ring: Ring, cfg: WorkerConfig, info: WorkerInfo) -> None:
        super().__init__(ring, cfg, info)
        self.views = field_views(ring, self.spec)

    def _make(self, lane: Lane, item: Any, slot: int) -> tuple[int, int]:
        batch = next(lane.it) if item is NOTHING else item  # type: ignore[arg-type]
        spec = self.spec
        rows, arrays = spec.batch_arrays(batch)
        for i, (view, arr) in enumerate(zip(self.views[slot], arrays)):
            if isinstance(arr, JaggedArray):
                spec.put_jagged_batch(i, arr, view)
            else:
                copy_rows(view, arr, rows)
        return rows, 0


class PackedStream(_Stream):
    """A stream of whole batches (a DataLoader's iterable dataset), each
    packed into the slot. An error ends its batch only, as in a
    DataLoader: the worker's iterator goes on (or ends) after it."""

    def __init__(self, ring: Ring, cfg: WorkerConfig, info: WorkerInfo) -> None:
        super().__init__(ring, cfg, info)
        self.slots = slot_arrays(ring)
        self.codec: Codec = cfg.source.codec

    def _make(self, lane: Lane, item: Any, slot: int) -> tuple[int, int]:
        batch = next(lane.it) if item is NOTHING else item  # type: ignore[arg-type]
        # Not made into the slot (the iterator ran before it was known).
        return pack(batch, self.slots[slot], self.codec)

    def _end_of_lane(self, lane: Lane, slot: int) -> tuple[int, int]:
        """A stateful dataset's state as its iterator ended, asked here,
        in the lane's worker, after StopIteration: packed into the end
        marker's slot, for the consumer to record as the lane's place
        between passes. Nothing is asked of any other dataset."""
        state_at_end = getattr(lane.it, "state_at_end", None)
        state = None if state_at_end is None else state_at_end()
        if state is None:
            return 0, 0
        return pack(state, self.slots[slot], self.codec)

    def _failed(self, slot: int, exc: Exception, lane: Lane, pass_: int) -> bool:
        self._report(slot, exc, 0, pass_)
        return True


class SampleStream(_Stream):
    """A stream of samples, ``stream_rows`` to a batch, each written
    straight into its row of the slot; each worker's short last batch
    dropped with drop_last. An error ends this worker's pass, and names
    the sample's place in its stream."""

    def __init__(self, ring: Ring, cfg: WorkerConfig, info: WorkerInfo) -> None:
        super().__init__(ring, cfg, info)
        self.views = field_views(ring, self.spec)
        # Copies samples into rows; its `row` names the sample being made
        # (-1 until a sample's row is being made).
        self.rows = RowWriter(self.spec)
        self.rows.row = -1
        self.batch_rows = cfg.stream_rows
        self.drop_last = cfg.drop_last

    def _make(self, lane: Lane, item: Any, slot: int) -> tuple[int, int]:
        writer = self.rows
        writer.row = -1
        rows = 0
        it = lane.it
        if not lane.ended:
            views = self.views[slot]
            start = 0
            if item is not NOTHING:  # the sample that inferred the spec
                writer.write_samples(lambda _: item, [0], views)
                start = 1
            rows = writer.write_stream(it, start, self.batch_rows, views)
        lane.ended = ended = rows < self.batch_rows
        if rows == 0 or (ended and self.drop_last):
            raise StopIteration  # nothing (more) to deliver
        lane.drawn += rows
        return rows, 0

    def _failed(self, slot: int, exc: Exception, lane: Lane, pass_: int) -> bool:
        place = _stream_position(lane.it, lane.drawn, self.rows.row)
        self._report(slot, exc, place, pass_)
        return False


def _stream_position(it: Iterator[Any] | None, drawn: int, row: int) -> int:
    """The failing sample's place in its worker's stream, as the slot
    header's 32-bit sample field holds it: past the `drawn` samples before
    this batch, or where a shuffle buffer took it from the stream."""
    if row < 0:
        return UNKNOWN_SAMPLE
    place = it.position if isinstance(it, ShuffleBuffer) else drawn + row
    return min(place, UNKNOWN_SAMPLE - 1) if place >= 0 else UNKNOWN_SAMPLE


def pass_over(it: Iterator[Any], n: int) -> None:
    """Moves a resumed stream past the n items delivered before its state:
    with the iterator's own ``skip(n)`` where it has one (a reader that can
    seek), else by making them again, unseen."""
    skip = getattr(it, "skip", None)
    if callable(skip):
        skip(n)
        return
    for _ in itertools.islice(it, n):
        pass
