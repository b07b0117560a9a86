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
from .._core._turns import take_turn
from .._layout._jagged import JaggedArray
from .._layout._packing import Codec, pack
from .._layout._rows import RowWriter, copy_rows
from .._make._streams import ShuffleBuffer
from .._make._worker_info import WorkerInfo
from ._worker_loops import First, Producer, field_views, slot_arrays
from ._worker_setup import NOTHING, open_stream

if TYPE_CHECKING:
    from ._config import WorkerConfig


class _Stream(Producer):
    """A stream source (fastq._make._streams), read in passes: the consumer
    starts each, and this worker opens its stream afresh for it, ends it
    with an end marker, and waits for the next. A kind makes a batch from
    the stream (``_make``) and says what an error in it means
    (``_failed``); the slots come in the ring's order, or in turns."""

    keeps_first_plan = False

    def __init__(self, ring: Ring, cfg: WorkerConfig, info: WorkerInfo) -> None:
        super().__init__(ring, cfg, info)
        self.turn = cfg.first_turn  # with turns: this worker's next one

    def _make(self, it: Iterator[Any], item: Any, slot: int) -> tuple[int, int]:
        """The next batch from `it` (`item` first, unless NOTHING) into
        slot: (rows, or a packed batch's arena bytes; its record bytes).
        Raises StopIteration once the pass has nothing more for it."""
        raise NotImplementedError

    def _failed(
        self, slot: int, exc: Exception, it: Iterator[Any] | None, pass_: int
    ) -> bool:
        """Reports exc in place of the slot's batch: whether this worker's
        pass goes on after it (here: it ends there)."""
        self._report(slot, exc, 0, pass_)
        return False

    def _new_pass(self, drawn: int) -> None:
        """A pass begins for this worker, `drawn` items of its stream
        already delivered (a resumed state's)."""

    def run(self, first: First) -> None:
        """`first`: the iterator and first item (a batch, or a sample of a
        sample stream) that inferred the spec."""
        ring = self.ring
        cfg = self.cfg
        wid = self.wid
        take = self._take_turn if cfg.turns else self._take_next
        make = self._make
        # `first`, its open iterator and a state's items belong to the
        # ring's pass 0, whatever pass the consumer has reached by the time
        # this worker starts (a slow worker_init, a `break` meanwhile): a
        # later pass opens a fresh stream and resumes nothing.
        pass_ = 0
        it: Iterator[Any] | None = None
        held = NOTHING
        if first is not None:
            it, held = first
        resume = cfg.resume_items  # items of pass 0 delivered before a state
        while True:
            slot, current, wait_ns = take(pass_)
            if slot < 0:
                return
            t0 = time.perf_counter_ns()
            if current != pass_ or it is None:
                # A new pass (or the first): abandon the old iterator, and
                # the item it made before the ring existed.
                if current != pass_:
                    held = NOTHING
                pass_, it = current, None
                self._new_pass(0)
            try:
                if it is None:
                    it = open_stream(cfg, pass_)
                if resume and pass_ == 0:
                    skip, resume = resume, 0
                    self._new_pass(skip)
                    if held is not NOTHING:
                        held, skip = NOTHING, skip - 1
                    pass_over(it, skip)
                item, held = held, NOTHING
                rows, record = make(it, item, slot)
            except StopIteration:
                if not ring.publish(slot, SLOT_END, 0, pass_, wid):
                    return
                if not self._wait_for_next_pass(pass_):
                    return
                it = None
                continue
            except Exception as exc:
                if self._failed(slot, exc, it, pass_):
                    continue
                # The error ends this worker's pass. A loop that stopped
                # before reaching it (a `break`) starts another pass: join
                # it with a fresh iterator, as after an end of stream.
                if not self._wait_for_next_pass(pass_):
                    return
                it = None
                continue
            ring.batch_done(wid, time.perf_counter_ns() - t0, wait_ns)
            if not ring.publish(slot, SLOT_BATCH, rows, pass_, wid, 0, record):
                return

    def _take_next(self, pass_: int) -> tuple[int, int, int]:
        """(slot, the ring's pass, wait_ns) for the next task in the ring's
        order; slot < 0 once the ring is closed."""
        slot, _, wait_ns = self._take_slot()
        return slot, (pass_ if slot < 0 else self.ring.pass_), wait_ns

    def _take_turn(self, pass_: int) -> tuple[int, int, int]:
        """(slot, pass, wait_ns) for this worker's next turn (fastq._core._turns);
        whatever the slot carries uses the turn up."""
        slot, current, turn, wait_ns = take_turn(
            self.ring, self.wid, self.cfg.num_workers, pass_, self.turn
        )
        self.turn = turn + 1
        return slot, current, wait_ns

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
        """Reports a failure outside any batch (worker_init) in each pass:
        a pass that a `break` abandoned before the report must not leave
        the next one waiting for this worker's end of stream. Idles until
        the consumer closes the ring."""
        if self.cfg.turns:
            self._report_in_turns(exc)
            self._idle_until_closed()
            return
        while True:
            slot, pass_, _ = self._take_next(0)
            if slot < 0:
                return
            self._report(slot, exc, UNKNOWN_SAMPLE, pass_)  # at no sample
            if not self._wait_for_next_pass(pass_):
                break
        self._idle_until_closed()

    def _report_in_turns(self, exc: BaseException) -> None:
        """report_and_stop for turns: in each pass, the error in this
        worker's first turn, then its end marker in the next."""
        pass_ = 0
        first = turn = self.cfg.first_turn
        while True:
            slot, current, turn, _ = take_turn(
                self.ring, self.wid, self.cfg.num_workers, pass_, turn
            )
            if slot < 0:
                return
            if current != pass_:
                pass_, first = current, 0
            if turn == first:
                self._report(slot, exc, UNKNOWN_SAMPLE, pass_)
                turn += 1
                continue
            if not self.ring.publish(slot, SLOT_END, 0, pass_, self.wid):
                return
            if not self._wait_for_next_pass(pass_):
                return


class BatchStream(_Stream):
    """A stream of whole batches, each copied into the slot's field arrays.
    An error ends this worker's pass."""

    def __init__(self, ring: Ring, cfg: WorkerConfig, info: WorkerInfo) -> None:
        super().__init__(ring, cfg, info)
        self.views = field_views(ring, self.spec)

    def _make(self, it: Iterator[Any], item: Any, slot: int) -> tuple[int, int]:
        batch = next(it) if item is NOTHING else item
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

    def _make(self, it: Iterator[Any], item: Any, slot: int) -> tuple[int, int]:
        batch = next(it) if item is NOTHING else item
        # Not made into the slot (the iterator ran before it was known).
        return pack(batch, self.slots[slot], self.codec)

    def _failed(
        self, slot: int, exc: Exception, it: Iterator[Any] | None, pass_: int
    ) -> bool:
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
        self.drawn = 0  # samples taken from this pass's stream before this batch
        self.ended = False  # the stream ended inside its last batch

    def _new_pass(self, drawn: int) -> None:
        self.drawn, self.ended = drawn, False
        self.rows.row = -1

    def _make(self, it: Iterator[Any], item: Any, slot: int) -> tuple[int, int]:
        writer = self.rows
        writer.row = -1
        rows = 0
        if not self.ended:
            views = self.views[slot]
            start = 0
            if item is not NOTHING:  # the sample that inferred the spec
                writer.write_samples(lambda _: item, [0], views)
                start = 1
            rows = writer.write_stream(it, start, self.batch_rows, views)
        self.ended = ended = rows < self.batch_rows
        if rows == 0 or (ended and self.drop_last):
            raise StopIteration  # nothing (more) to deliver
        self.drawn += rows
        return rows, 0

    def _failed(
        self, slot: int, exc: Exception, it: Iterator[Any] | None, pass_: int
    ) -> bool:
        self._report(slot, exc, _stream_position(it, self.drawn, self.rows.row), pass_)
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
