"""The consumer's loop: epochs and passes over the ring, the wait for the
next batch with the slot census checked before sleeping, and the errors a
batch can carry. The compiled Consumer files every slot it pops; this module
holds the policy."""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _report
from ._jagged import JaggedArray
from ._packing import PackedSpec
from ._ring import (
    ALERT,
    CLOSED,
    LOCAL_DEFERRED,
    LOCAL_LEASED,
    LOCAL_NONE,
    LOCAL_PENDING,
    LOCAL_WINDOW,
    NO_TASK,
    OWNER_CONSUMER,
    OWNER_FREE,
    OWNER_READY,
    OWNER_WORKER,
    SLOT_BATCH,
    SLOT_END,
    SLOT_ERROR,
    BatchViews,
    Consumer,
    Ring,
    SlotLease,
)
from ._state import StreamResume
from .errors import (
    FetchTimeout,
    PrefetcherClosed,
    RingError,
    SlotsExhausted,
    WorkerDied,
)

if TYPE_CHECKING:
    from ._pool import WorkerPool
    from ._sampler import EpochSampler
    from ._spec import BatchSpec
    from ._turns import Turns

_ALL_TASKS = 1 << 63
# The token of a loop that ran to its end: never current, never closed.
_FINISHED = -1
_LOCAL_NAMES = {
    LOCAL_NONE: "not its own",
    LOCAL_WINDOW: "waiting in the reorder window",
    LOCAL_PENDING: "being handed out",
    LOCAL_LEASED: "handed out",
    LOCAL_DEFERRED: "released, its return deferred",
}


class Feed:
    """Hands out the ring's batches in the promised order.

    ``host`` is the Prefetcher (a weak proxy: the feed must not keep it
    alive): its ``_make_batch`` turns a batch's leaf arrays into what the
    iteration yields (``_unpack`` a packed slot's lease, for a PackedSpec),
    ``_reclaim_slots`` returns slots it holds for pending work (GPU copies)
    before the consumer sleeps, and ``_fail`` closes it and raises.

    With ``fatal_errors`` False (a DataLoader's meaning), a worker's
    exception is raised at its batch's turn and the loop may go on past it;
    otherwise it closes the Prefetcher. ``indices_of(task)`` names the
    sample indices of a planned task, for error messages.
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
        host: Any,
        fatal_errors: bool = True,
        indices_of: Any = None,
        sample_stream: bool = False,
        views: BatchViews | None = None,
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
        self.host = host
        self.fatal_errors = fatal_errors
        # A stream of samples, batch_size to a batch: its state counts
        # samples, its errors name a sample of the worker's stream.
        self.sample_stream = sample_stream
        self.consumer.count_rows = sample_stream
        self.indices_of = indices_of
        # Makes a plain batch in compiled code (None: every batch takes the
        # full path: packed, jagged, or copied out).
        self.views = views
        self.packed = isinstance(spec, PackedSpec)
        self.live = 0  # which `for` loop is current
        # The loop that was current when the Prefetcher closed (or this
        # process was forked from the consumer), and why: it raises
        # PrefetcherClosed at its next next() instead of ending quietly.
        self.loops_closed = False
        # Loops ended with an error other than a close (a state loaded
        # while they ran): token -> (exception type, message).
        self.ended: dict[int, tuple[type[Exception], str]] = {}
        _live_feeds.add(self)
        self.epoch = -1  # map: epoch being (or last) iterated
        self.epoch_done = True
        # A resumed state (fastq._state): the next epoch starts at batch
        # resume_batch, and drops the batches in resume_skip (unordered
        # mode: delivered before the state was saved).
        self.resume_batch = 0
        self.resume_skip: frozenset[int] = frozenset()
        # The epoch in progress: its first task, the batches of it handed
        # out before this loop (a resumed state's), the consumer's count
        # when the loop began, and (unordered) which tasks it handed out.
        self.in_epoch = False
        self.epoch_start = 0
        self.epoch_done_before = 0
        self.epoch_handed0 = 0
        self.delivered: set[int] | None = None
        self.pass_started = False  # callable: pass 0 not yet handed out
        # Callable: the state's counts for the next pass to start from (the
        # Consumer counts each worker's items handed out in the current
        # pass, with a resumed state's, delivered before it).
        self.in_pass = False
        self.resume_items: list[int] | None = None
        self.first_pass = 0  # the number of the ring's pass 0 (a state's)
        # A stream whose workers' items come in turn (fastq/_turns.py).
        self.turns: Turns | None = None
        self.wait_ns = 0  # stats: waiting for batches, after the first

    # ------------------------------------------------------------ passes

    def begin_epoch(self) -> Iterator[Any]:
        assert self.sampler is not None
        self.live += 1
        c = self.consumer
        b = self.sampler.batches_per_epoch
        self.epoch += 1
        start = self.epoch * b
        first = start + self.resume_batch
        skip = frozenset(start + k for k in self.resume_skip)
        if not self.epoch_done or first > start:
            # The last loop stopped early, or a resumed state starts past
            # the epoch's start: workers jump ahead; what is still in
            # flight before `first` is dropped when it arrives.
            self.ring.skip_tasks_to(first)
        c.pending = -1  # a batch of the abandoned epoch never handed out
        c.next_task = first
        c.drop_below(first)
        self.epoch_done = False
        self.in_epoch = True
        self.epoch_start = start
        self.epoch_done_before = self.resume_batch
        self.epoch_handed0 = c.handed
        self.delivered = None if self.ordered else set(skip)
        count = b - self.resume_batch
        self.resume_batch, self.resume_skip = 0, frozenset()
        return _EpochIterator(self, self.live, first, start + b, c.handed, count, skip)

    def begin_pass(self) -> Iterator[Any]:
        self.live += 1
        c = self.consumer
        if self.pass_started:
            # Items of an abandoned pass still in flight are dropped as they
            # arrive: in ordered mode each one advances the sequence, so
            # none may vanish before its turn.
            c.pass_ += 1
            self.ring.set_pass(c.pass_)
        self.pass_started = True
        self.in_pass = True
        c.items = self.resume_items or [0] * self.pool.size
        self.resume_items = None
        if self.turns is not None:
            self.turns.begin(c.pass_)
        return _PassIterator(self, self.live, c.ends)

    def stream_place(self) -> StreamResume:
        """Where a stream is: the pass in progress and each worker's items
        delivered in it; between passes (or with a state loaded, not yet
        used), where the next pass starts."""
        c = self.consumer
        if self.in_pass:
            return StreamResume(self.first_pass + c.pass_, c.items)
        following = c.pass_ + 1 if self.pass_started else c.pass_
        items = self.resume_items or [0] * self.pool.size
        return StreamResume(self.first_pass + following, list(items))

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
        current when the Prefetcher closed (or a state was loaded)."""
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
            self.host._fail(self.worker_died(pool.failure))
        while not c.take(lo, hi, ordered):
            if pool.failure is not None:
                self.host._fail(self.worker_died(pool.failure))
            if not spun:
                # Spin first (no system call): the batch is usually close.
                spun = True
                if c.wait(lo, hi, ordered, self.spin_s, True) == 0:
                    continue
            if t0 == 0:
                t0 = time.perf_counter_ns()
                if self.timeout is not None:
                    deadline = time.monotonic() + self.timeout
            self.host._reclaim_slots()
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
                    self.host._fail(self.worker_died(failure))
            elif rc == CLOSED:
                raise PrefetcherClosed(
                    "the Prefetcher was closed while waiting for a batch"
                )
            elif self.timeout is not None and time.monotonic() >= deadline:
                self.host._fail(self.timeout_error())
        if t0 and c.delivered:  # the first batch's wait is start-up
            self.wait_ns += time.perf_counter_ns() - t0
        return c.lease()

    def hand_out(self, lease: SlotLease) -> Any:
        """The batch in a pending lease, as the iteration yields it. The
        caller marks it handed out (``consumer.pending = -1``) last."""
        if lease.kind == SLOT_ERROR:
            error = self.worker_error(lease)
            if self.fatal_errors:
                self.host._fail(error)
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
            batch = self.host._unpack(lease)
        else:
            arrays = self.spec.views(lease, rows)
            if self.spec.jagged:
                nbytes += sum(a.values.nbytes for a in arrays if type(a) is JaggedArray)
            if self.copy:
                arrays = [a.copy() for a in arrays]
                lease.release()
            batch = self.host._make_batch(arrays)
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
            self.host._fail(self.lost_slot_error(odd))
        n = self.ring.nslots
        if mine < n:
            # A slot is with a worker or in a queue: waiting can end. (A
            # release kept for a stalled popper counts here too: that popper
            # holds a slot the census does not give the consumer.)
            return
        raise SlotsExhausted(
            f"all {n} slots are held ({c.held} by batches you still "
            f"reference, {c.in_window} waiting their turn), so no worker can "
            "produce the next batch. Drop references to earlier batches (or "
            "copy what you keep: np.array(x)), pass copy=True, or raise slots="
        )

    def lost_slot_error(self, slot: int) -> RingError:
        kind, who, task = self.ring.census()[slot]
        local = _LOCAL_NAMES[self.consumer.local_states()[slot]]
        last = {
            OWNER_FREE: "the FREE queue",
            OWNER_CONSUMER: "the consumer",
            OWNER_WORKER: f"worker {who}",
            OWNER_READY: f"worker {who} (published)",
        }[kind]
        batch = "" if task == NO_TASK else f", batch {task}"
        return RingError(
            f"slot {slot} is unaccounted for: the shared census says it was "
            f"last held by {last}{batch}, but this process has it as {local}; "
            "the ring cannot be trusted, so the Prefetcher was closed"
        )

    # ------------------------------------------------------------ errors

    def worker_error(self, lease: SlotLease) -> Exception:
        """The error a worker published in place of a batch."""
        task, worker = lease.task, lease.worker
        report = _report.decode(memoryview(lease)[: lease.payload_bytes])
        indices: Any = None
        if self.sampler is not None:
            indices = self.sampler.batch_indices(task)
        elif self.indices_of is not None:
            indices = self.indices_of(task)
        stream_place = None
        if self.sampler is None and self.indices_of is None:
            # A stream: the ring's task count means nothing to the user;
            # the place in the worker's own stream does (each worker's
            # items are handed out in its order, the failed batch counted).
            stream_place = self.consumer.items[worker]
            if not self.sample_stream:
                stream_place = max(0, stream_place - 1)
        return batch_error(
            report,
            worker=worker,
            pid=self.pool.pids[worker],
            task=task,
            position=lease.sample,
            indices=indices,
            stream_place=stream_place,
            sample_stream=self.sample_stream,
        )

    def worker_died(self, failure: WorkerDied) -> WorkerDied:
        """Names the batch a worker that died mid-claim took with it: its
        claim was made, its record not, so it is the task the loop waits
        for that no slot records."""
        if failure.task is not None or not failure.claiming or not self.ordered:
            return failure
        c = self.consumer
        census = self.ring.census()
        if any(
            kind == OWNER_WORKER and task == NO_TASK and who != failure.worker
            for kind, who, task in census
        ):
            # Another worker is between its pop and its record too: the
            # unrecorded batch may be its, so none is named.
            return failure
        recorded = {t for _, _, t in census if t != NO_TASK}
        for task in range(c.next_task, self.ring.next_task):
            if task not in recorded:
                failure.task = task
                failure.args = (
                    f"{failure.args[0]}; batch {task}, which it had just "
                    "claimed, is lost with it",
                )
                break
        return failure

    def timeout_error(self) -> FetchTimeout:
        holders = self.pool.holders()
        wanted = self.consumer.next_task if self.ordered else None
        stuck = next((w for w, t in holders if t == wanted), None)
        if stuck is None and holders:
            stuck = min(holders, key=lambda h: h[1])[0]
        detail = ""
        if stuck is not None:
            pid = self.pool.pids[stuck]
            task = dict(holders)[stuck]
            stack = self.pool.stack_of(stuck).strip()
            detail = f": worker {stuck} (pid {pid}) is still on batch {task}"
            if stack:
                detail += f". Its Python stack:\n{stack}\n"
        elif self.consumer.ndeferred:
            detail = (
                f": {self.consumer.ndeferred} freed slot(s) wait for a worker "
                "stopped inside a queue operation (a debugger, SIGSTOP or CPU "
                "throttling)"
            )
        return FetchTimeout(
            f"no batch within timeout={self.timeout} s{detail}\nRaise timeout= "
            "if batches are legitimately slow.",
            worker=stuck,
            task=wanted if wanted is not None else -1,
        )


# Feeds alive in this process, for the fork hook below.
_live_feeds: weakref.WeakSet[Feed] = weakref.WeakSet()


def batch_error(
    report: _report.Report,
    *,
    worker: int,
    pid: int,
    task: int,
    position: int,
    indices: Any,
    stream_place: int | None = None,
    sample_stream: bool = False,
) -> Exception:
    """The exception for a worker's report on batch ``task``, naming the
    sample at ``position`` of its ``indices`` when both are known. A
    stream's (``stream_place``: the worker's items handed out before it in
    this pass) names the place in the worker's own stream instead: the
    sample at ``position`` of a sample stream, else the batch."""
    sample_index = None
    if stream_place is not None:
        task = -1
        if not sample_stream:
            where = f"batch {stream_place} of worker {worker}'s stream in this pass"
        elif position != _report.UNKNOWN_SAMPLE:
            where = f"sample {position} of worker {worker}'s stream in this pass"
        else:
            where = f"worker {worker}'s stream, after sample {stream_place - 1}"
            if stream_place == 0:
                where = f"worker {worker}'s stream, before its first sample"
    else:
        where = f"batch {task}"
        if indices is not None and 0 <= position < len(indices):
            sample_index = indices[position]
            if isinstance(sample_index, np.integer):
                sample_index = int(sample_index)
            where += f", sample {sample_index!r}"
    return report.error(
        worker=worker, pid=pid, where=where, task=task, sample=sample_index
    )


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


class _EpochIterator:
    """One epoch of a map-style source. A class, not a generator: an
    exception inside ``__next__`` (Ctrl+C included) leaves it usable, and
    the batch it was handing out comes next."""

    __slots__ = ("_count", "_feed", "_handed0", "_hi", "_lo", "_skip", "_token")

    def __init__(
        self,
        feed: Feed,
        token: int,
        lo: int,
        hi: int,
        handed0: int,
        count: int,
        skip: frozenset[int] = frozenset(),
    ) -> None:
        self._feed = feed
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
                self._lo,
                self._hi,
                feed.ordered,
                views,
                False,
                feed.delivered,
                self._skip,
            )
            if batch is not None:
                return batch
        if self._token != feed.live:
            feed.check_closed(self._token)
            raise StopIteration
        while True:
            if c.handed - self._handed0 >= self._count:
                feed.epoch_done = True
                feed.in_epoch = False
                self._token = _FINISHED  # a later close() does not concern it
                raise StopIteration
            lease = feed.next_lease(self._lo, self._hi)
            if feed.delivered is None:
                break
            if lease.task not in self._skip:
                feed.delivered.add(lease.task)
                break
            del lease
            c.pending = -1  # delivered before the state was saved: dropped
        batch = feed.hand_out(lease)
        c.pending = -1  # handed out: an attribute store, then straight out
        return batch


class _PassIterator:
    """One pass over a callable source: until every worker's iterator has
    ended. Usable after an exception, like _EpochIterator."""

    __slots__ = ("_ends0", "_feed", "_token", "_workers")

    def __init__(self, feed: Feed, token: int, ends0: int) -> None:
        self._feed = feed
        self._token = token
        self._ends0 = ends0
        self._workers = feed.pool.size

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
                return batch
        while self._token == feed.live and c.ends - self._ends0 < workers:
            lease = feed.next_lease(0, _ALL_TASKS)
            if lease.pass_ < c.pass_ or lease.kind == SLOT_END:
                if turns is not None and lease.pass_ == c.pass_:
                    turns.ended_at(lease.worker, lease.task)
                del lease
                c.pending = -1  # dropped; an end marker is counted there
                if turns is not None:
                    turns.advance()
                continue
            # A sample stream's state counts samples: it resumes with any
            # batch size.
            c.count_item(lease.worker, lease.rows)
            batch = feed.hand_out(lease)
            c.pending = -1
            return batch
        if self._token != feed.live:
            feed.check_closed(self._token)
        else:
            feed.in_pass = False
        self._token = _FINISHED
        raise StopIteration
