"""The consumer's loop: the wait for the next batch, with the slot census
checked before sleeping, and its hand-out in the promised order. Where the
loop is lives in _cursor; the words of its errors in _diagnosis."""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

import numpy as np

from .._core._ring import (
    ALERT,
    CLOSED,
    SLOT_BATCH,
    SLOT_END,
    SLOT_ERROR,
    BatchViews,
    Consumer,
    Ring,
    SlotLease,
)
from .._layout._jagged import JaggedArray
from .._layout._packing import PackedSpec
from .._make._state import StreamResume
from ..errors import PrefetcherClosed, RingError, SharedMemoryError, WorkerDied
from . import _diagnosis
from ._cursor import EpochCursor, PassCursor

if TYPE_CHECKING:
    from .._core._turns import Turns
    from .._layout._spec import BatchSpec
    from .._make._sampler import EpochSampler
    from .._workers._pool import WorkerPool

_ALL_TASKS = 1 << 63
# The token of a loop that ran to its end: never current, never closed.
_FINISHED = -1


class FeedOwner(Protocol):
    """What a Feed calls back on the object that owns it (held through a
    weak proxy: the Feed must not keep it alive)."""

    def fail(self, exc: BaseException) -> NoReturn:
        """Closes the owner, then raises ``exc``."""
        ...

    def make_batch(self, arrays: list[np.ndarray[Any, Any]]) -> Any:
        """What the iteration yields for one batch's leaf arrays (views of
        its slot, or copies)."""
        ...

    def unpack(self, lease: SlotLease) -> Any:
        """What the iteration yields for a packed slot's lease (a
        PackedSpec's; fastq/_layout/_packing.py)."""
        ...

    def lane_ended(self, lease: SlotLease) -> None:
        """A lane's end marker that carries a packed record (a stateful
        dataset's state as the lane's iterator ended): the owner keeps it
        as the lane's place."""
        ...

    def returning_slots(self) -> int:
        """Slots the consumer holds that come back without the loop (a
        pinned ring's, once the GPU has read them): the census counts them
        as on their way to the workers."""
        ...


class Feed:
    """Hands out the ring's batches in the promised order.

    ``owner`` turns each batch into what the iteration yields, returns the
    slots it holds before the consumer sleeps, and is closed by ``fail``
    on a fatal error (see FeedOwner).

    With ``fatal_errors`` False (a DataLoader's meaning), a worker's
    exception is raised at its batch's turn and the loop may go on past it;
    otherwise it closes the owner. ``indices_of(task)`` names the sample
    indices of a planned task, for error messages.
    """

    def __init__(
        self,
        ring: Ring,
        pool: WorkerPool,
        spec: BatchSpec,
        sampler: EpochSampler | None,
        *,
        ordered: bool,
        timeout: float | None,
        copy: bool,
        spin_s: float,
        owner: FeedOwner,
        fatal_errors: bool = True,
        indices_of: Callable[[int], Any] | None = None,
        sample_stream: bool = False,
        views: BatchViews | None = None,
        streams: int = 0,
    ) -> None:
        self.ring = ring
        self.consumer = Consumer(ring)
        self.pool = pool
        self.spec = spec
        self.sampler = sampler
        self.ordered = ordered
        self.timeout = timeout
        self.copy = copy
        self.spin_s = spin_s
        self.owner: FeedOwner = weakref.proxy(owner)
        self.fatal_errors = fatal_errors
        # A stream of samples, batch_size to a batch: its state counts
        # samples, its errors name a sample of the worker's stream.
        self.sample_stream = sample_stream
        self.consumer.count_rows = sample_stream
        # A stream's lanes (NOTE [ A stream's lanes ] in
        # fastq/_workers/_lanes.py): whose items and end markers it counts.
        self.streams = streams or pool.size
        # What names a task's sample indices in errors (None: a stream).
        self.indices_of = sampler.batch_indices if sampler is not None else indices_of
        # Makes a plain batch in compiled code (None: every batch takes the
        # full path: packed, jagged, or copied out).
        self.views = views
        self.packed = isinstance(spec, PackedSpec)
        self.live = 0  # which `for` loop is current
        # The loop that was current when the owner closed (or this process
        # was forked from the consumer), and why: it raises
        # PrefetcherClosed at its next next() instead of ending quietly.
        self.loops_closed = False
        # Loops ended with an error other than a close (a state loaded
        # while they ran): token -> (exception type, message).
        self.ended: dict[int, tuple[type[Exception], str]] = {}
        _live_feeds.add(self)
        self.epochs = EpochCursor(ordered)
        self.passes = PassCursor()
        # A stream whose workers' items come in turn (fastq/_core/_turns.py).
        self.turns: Turns | None = None
        self.wait_ns = 0  # stats: waiting for batches, after the first
        # True while a dropped loop lets go of its face (NOTE [ A loop holds
        # its face ]): a face it held last is closed then, and says nothing.
        self.released_by_loop = False

    # ------------------------------------------------------------ passes

    def begin_epoch(self, face: object = None) -> Iterator[Any]:
        """One epoch's loop, which holds ``face`` (NOTE [ A loop holds its
        face ])."""
        assert self.sampler is not None
        self.live += 1
        c = self.consumer
        span = self.epochs.upcoming(self.sampler.batches_per_epoch)
        if span.jump:
            self.ring.skip_tasks_to(span.first)
        c.pending = -1  # a batch of the abandoned epoch never handed out
        c.next_task = span.first
        c.drop_below(span.first)
        self.epochs.enter(span, c.handed)
        c.handed_tasks = self.epochs.delivered  # joined at each hand-out
        return _EpochIterator(
            self, face, self.live, span.first, span.end, c.handed, span.count, span.skip
        )

    def begin_pass(self, face: object = None) -> Iterator[Any]:
        """One pass's loop, which holds ``face`` (NOTE [ A loop holds its
        face ])."""
        self.live += 1
        c = self.consumer
        advance, items = self.passes.begin(self.streams)
        if advance:
            # Items of an abandoned pass still in flight are dropped as they
            # arrive: in ordered mode each one advances the sequence, so
            # none may vanish before its turn.
            c.pass_ += 1
            self.ring.set_pass(c.pass_)
        c.handed_tasks = None
        # (The ring has a count for each lane and each process.)
        c.items = items + [0] * (len(c.items) - len(items))
        if self.turns is not None:
            self.turns.begin(c.pass_)
        return _PassIterator(self, face, self.live, c.ends)

    def epoch_place(self) -> tuple[int, int, list[int] | None]:
        """Where a map-style source's state saved now resumes (EpochCursor.
        place): what was handed out, so that a batch left pending by an
        interrupt is the resumed run's."""
        return self.epochs.place(self.consumer.handed)

    def stream_place(self) -> StreamResume:
        """Where a stream is: the pass in progress and each worker's items
        delivered in it; between passes (or with a state loaded, not yet
        used), where the next pass starts."""
        c = self.consumer
        streams = self.streams
        return self.passes.place(c.pass_, c.items[:streams], streams)

    def close_loops(self, why: str) -> None:
        """Ends every open loop. The current one raises PrefetcherClosed
        (why) at its next next(); older ones, which a newer iter() had
        already superseded, end quietly as DataLoader's do."""
        if not self.loops_closed:
            self.loops_closed = True
            self.end_loops(PrefetcherClosed, why)
        else:
            self.live += 1

    def end_loops(self, error: type[Exception], why: str) -> None:
        """Ends every open loop; the current one raises error(why) at its
        next next()."""
        self.ended[self.live] = (error, why)
        self.live += 1

    def check_closed(self, token: int) -> None:
        """For a loop whose turn is over (token != live): raises if it was
        current when the owner closed (or a state was loaded)."""
        ended = self.ended.get(token)
        if ended is not None:
            raise ended[0](ended[1])

    # ------------------------------------------------------------ taking

    def next_lease(self, lo: int, hi: int) -> SlotLease:
        """A lease over the next pending batch among tasks [lo, hi), after
        waiting for it if need be."""
        c = self.consumer
        ordered = self.ordered
        pool = self.pool
        spun = False
        deadline = 0.0
        t0 = 0
        # A death is reported at the next fetch even when the batches this
        # one needs are already here (nothing may silently go on).
        if pool.failure is not None:
            self._died(pool.failure)
        while not c.take(lo, hi, ordered):
            if pool.failure is not None:
                self._died(pool.failure)
            if not spun:
                # Spin first (no system call): the batch is usually close.
                spun = True
                if c.wait(lo, hi, ordered, self.spin_s, True) == 0:
                    continue
            if t0 == 0:
                t0 = time.perf_counter_ns()
                if self.timeout is not None:
                    deadline = time.monotonic() + self.timeout
            if self.turns is not None:
                self.turns.grant()  # batches released since the last grant
            if c.take(lo, hi, ordered):
                break
            self.check_census()
            left = -1.0 if self.timeout is None else deadline - time.monotonic()
            rc = c.wait(lo, hi, ordered, max(left, 0.0) if left >= 0 else -1.0, False)
            if rc == 0:
                continue
            if rc == ALERT:
                failure = pool.failure
                if failure is not None:
                    self._died(failure)
            elif rc == CLOSED:
                raise PrefetcherClosed(
                    "the Prefetcher was closed while waiting for a batch"
                )
            elif self.timeout is not None and time.monotonic() >= deadline:
                self.owner.fail(
                    _diagnosis.timeout_error(
                        pool, c, ordered=ordered, timeout=self.timeout
                    )
                )
        if t0 and c.delivered:  # the first batch's wait is start-up
            self.wait_ns += time.perf_counter_ns() - t0
        return c.lease()

    def check_workers(self) -> None:
        """Raises a worker's death that no wait has met (the batches were
        all there): at an epoch's or a pass's end, which a death must not
        pass for a clean end, as DataLoader's SIGCHLD handler would not let
        it."""
        self.pool.check_deaths()
        if self.pool.failure is not None:
            self._died(self.pool.failure)

    def _died(self, failure: WorkerDied | SharedMemoryError) -> NoReturn:
        if isinstance(failure, WorkerDied):
            failure = _diagnosis.worker_died(
                failure, self.ring, self.consumer, ordered=self.ordered
            )
        self.owner.fail(failure)

    def hand_out(self, lease: SlotLease) -> Any:
        """The batch in a pending lease, as the iteration yields it. The
        caller marks it handed out (``consumer.pending = -1``) last."""
        if lease.kind == SLOT_ERROR:
            error = _diagnosis.worker_error(
                lease,
                pool=self.pool,
                consumer=self.consumer,
                indices_of=self.indices_of,
                sample_stream=self.sample_stream,
            )
            if self.fatal_errors:
                self.owner.fail(error)
            del lease
            self.consumer.pending = -1  # this batch is over: the loop goes on
            try:
                raise error
            finally:
                # No cycle through this frame: the error's traceback holds
                # the caller's, which holds the batch's lease (its slot).
                del error
        if lease.kind != SLOT_BATCH:
            raise RingError(f"slot {lease.slot} of kind {lease.kind} handed out")
        rows = lease.rows
        nbytes = rows * self.spec.row_bytes
        if self.packed:
            batch = self.owner.unpack(lease)
        else:
            arrays = self.spec.views(lease, rows)
            if self.spec.jagged:
                nbytes += sum(a.values.nbytes for a in arrays if type(a) is JaggedArray)
            if self.copy:
                arrays = [a.copy() for a in arrays]
                lease.release()
            batch = self.owner.make_batch(arrays)
        self.consumer.count_delivery(nbytes)
        return batch

    # ------------------------------------------------------------ census

    def check_census(self) -> None:
        """Before sleeping: every slot must be somewhere a batch can come
        from. Raises SlotsExhausted when the consumer holds them all, and
        RingError (closing first) when the census and this process's books
        disagree."""
        c = self.consumer
        mine, odd = c.audit()
        if odd >= 0:
            self.owner.fail(_diagnosis.lost_slot(self.ring, c, odd))
        n = self.ring.nslots
        if mine - self.owner.returning_slots() < n:
            # A slot is with a worker, in a queue, or on its way back from
            # the device: waiting can end. (A release kept for a stalled
            # popper counts here too: that popper holds a slot the census
            # does not give the consumer.)
            return
        raise _diagnosis.slots_exhausted(c, n)


# Feeds alive in this process, for the fork hook below.
_live_feeds: weakref.WeakSet[Feed] = weakref.WeakSet()


def _close_loops_in_forked_child() -> None:
    """A child forked from the consumer inherits its open loops; their
    batches and slots stay the parent's, so a next() here must take none
    (iter() is refused by the Prefetcher's own pid check)."""
    pid = os.getpid()
    for feed in list(_live_feeds):
        feed.close_loops(
            f"this process (pid {pid}) was forked from the consumer while this "
            "loop was open; its batches and slots are the parent's. Create a "
            "Prefetcher in the child"
        )


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_loops_in_forked_child)


# NOTE [ A loop holds its face ]
#
# `for batch in fastq.Prefetcher(...)` names no face: while the loop runs,
# its iterator is the face's only holder. The face owns the engine and
# closes it when it is garbage, and the Feed holds the engine only weakly
# (it must not keep its owner alive), so each loop holds its face: the
# engine lives as long as the loop (as `for b in DataLoader(...)` works).
# The face holds nothing of the loop, so there is no cycle: a
# face dropped outside a loop is closed at once, and one whose last loop
# is dropped is closed then. That loop releases it with the feed's
# `released_by_loop` set, so the face knows it was closed where a `with`
# block around the loop would have closed it, and warns of nothing. The
# release runs in __del__ and reads no module global, so it is safe at
# interpreter exit too.


class _Loop:
    """What every loop of a feed holds: the feed, and its face."""

    __slots__ = ("_face", "_feed")

    _face: object
    _feed: Feed

    def __del__(self) -> None:
        # NOTE [ A loop holds its face ]: the face is closed here if this
        # loop held it last.
        feed = self._feed
        feed.released_by_loop = True
        self._face = None
        feed.released_by_loop = False


class _EpochIterator(_Loop):
    """One epoch of a map-style source. A class, not a generator: an
    exception inside ``__next__`` (Ctrl+C included) leaves it usable, and
    the batch it was handing out comes next."""

    __slots__ = (
        "_count",
        "_handed0",
        "_hi",
        "_lo",
        "_skip",
        "_token",
    )

    def __init__(
        self,
        feed: Feed,
        face: object,
        token: int,
        lo: int,
        hi: int,
        handed0: int,
        count: int,
        skip: frozenset[int] = frozenset(),
    ) -> None:
        self._feed = feed
        self._face = face
        self._token = token
        self._lo = lo
        self._hi = hi
        self._handed0 = handed0
        self._count = count
        self._skip = skip  # tasks delivered before a resumed state: dropped

    def __iter__(self) -> _EpochIterator:
        return self

    def __next__(self) -> Any:
        feed = self._feed
        c = feed.consumer
        views = feed.views
        if (
            views is not None
            and self._token == feed.live
            and c.handed - self._handed0 < self._count
            and feed.pool.failure is None
        ):
            # The steady state: the batch is here; one compiled call.
            batch = c.hand_out_ready(
                self._lo, self._hi, feed.ordered, views, False, self._skip
            )
            if batch is not None:
                c.pending = -1  # handed out: an attribute store, then straight out
                return batch
        if self._token != feed.live:
            feed.check_closed(self._token)
            raise StopIteration
        while True:
            if c.handed - self._handed0 >= self._count:
                feed.check_workers()
                feed.epochs.finish()
                self._token = _FINISHED  # a later close() does not concern it
                raise StopIteration
            lease = feed.next_lease(self._lo, self._hi)
            if lease.task not in self._skip:
                break
            del lease
            c.pending = -1  # delivered before the state was saved: dropped
        batch = feed.hand_out(lease)
        c.pending = -1  # handed out: an attribute store, then straight out
        return batch


class _PassIterator(_Loop):
    """One pass over a callable source: until every worker's iterator has
    ended. Usable after an exception, like _EpochIterator."""

    __slots__ = ("_ends0", "_token", "_workers")

    def __init__(self, feed: Feed, face: object, token: int, ends0: int) -> None:
        self._feed = feed
        self._face = face
        self._token = token
        self._ends0 = ends0
        self._workers = feed.streams

    def __iter__(self) -> _PassIterator:
        return self

    def __next__(self) -> Any:
        feed = self._feed
        c = feed.consumer
        workers = self._workers
        views = feed.views
        turns = feed.turns
        if turns is not None and self._token == feed.live:
            turns.advance()
        if (
            views is not None
            and self._token == feed.live
            and c.ends - self._ends0 < workers
            and feed.pool.failure is None
        ):
            # The steady state: the batch is here; one compiled call.
            batch = c.hand_out_ready(0, _ALL_TASKS, feed.ordered, views, True)
            if batch is not None:
                c.pending = -1
                return batch
        while self._token == feed.live and c.ends - self._ends0 < workers:
            lease = feed.next_lease(0, _ALL_TASKS)
            if lease.pass_ < c.pass_ or lease.kind == SLOT_END:
                if lease.payload_bytes and lease.pass_ == c.pass_:
                    # A stateful dataset's state as the lane's pass ended.
                    feed.owner.lane_ended(lease)
                if turns is not None and lease.pass_ == c.pass_:
                    turns.ended_at(lease.worker, lease.task)
                del lease
                c.pending = -1  # dropped; an end marker is counted there
                if turns is not None:
                    turns.advance()
                continue
            # A sample stream's state counts samples: it resumes with any
            # batch size.
            c.count_item()
            batch = feed.hand_out(lease)
            c.pending = -1
            return batch
        if self._token != feed.live:
            feed.check_closed(self._token)
        else:
            feed.check_workers()
            feed.passes.end()
        self._token = _FINISHED
        raise StopIteration
