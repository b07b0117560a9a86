"""The Feed alone, without processes: a real ring on a private mapping of
this process, a fake pool and a fake owner, with this thread playing the
workers' side of the ring as fastq/_workers/_worker.py's producer does. Hand-out
order, resumed epochs, a stream's passes, each way a fetch fails, and an
interrupt at each point of a next()."""

from __future__ import annotations

import contextlib
import gc
import mmap
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any, NoReturn

import numpy as np
import pytest

from fastq._core import _report
from fastq._core._ring import (
    NO_TASK,
    OWNER_WORKER,
    SLOT_BATCH,
    SLOT_END,
    SLOT_ERROR,
    Ring,
    SlotLease,
    region_size,
)
from fastq._core._shm import PAGE_SIZE
from fastq._layout._packing import PackedSpec
from fastq._layout._spec import BatchSpec
from fastq._loop._consumer import Feed
from fastq._make._sampler import EpochSampler
from fastq._make._state import Resume, StreamResume
from fastq.errors import (
    FetchTimeout,
    PrefetcherClosed,
    SlotsExhausted,
    WorkerDied,
    WorkerError,
)

pytestmark = pytest.mark.timeout(60)

SLOTS = 4
WORKERS = 2
SLOT_BYTES = 64 * 1024  # room for an error report, as the Prefetcher's
ROWS = 4
SPEC = BatchSpec.from_user(((), "int64"), rows=ROWS)
PIDS = [4242, 4243]


class FakePool:
    """What a Feed reads of its WorkerPool: ``failure``, ``pids``,
    ``size``, ``holders()`` (from the census, as the pool's) and
    ``stack_of()``."""

    def __init__(self, ring: Ring) -> None:
        self.ring = ring
        self.failure: WorkerDied | None = None
        self.pids = list(PIDS)
        self.stacks: dict[int, str] = {}

    @property
    def size(self) -> int:
        return len(self.pids)

    def holders(self) -> list[tuple[int, int]]:
        return [
            (who, task)
            for kind, who, task in self.ring.census()
            if kind == OWNER_WORKER and task != NO_TASK
        ]

    def stack_of(self, wid: int) -> str:
        return self.stacks.get(wid, "")


class FakeOwner:
    """A FeedOwner that records what the Feed asks of it."""

    def __init__(self) -> None:
        self.failed: list[BaseException] = []
        self.made = 0
        self.unpacked: list[int] = []
        self.returning = 0  # slots it says are on their way back
        self.asked = 0

    def fail(self, exc: BaseException) -> NoReturn:
        self.failed.append(exc)
        raise exc

    def make_batch(self, arrays: list[np.ndarray[Any, Any]]) -> Any:
        self.made += 1
        return list(arrays)  # views of the slot: they hold its lease

    def unpack(self, lease: SlotLease) -> Any:
        self.unpacked.append(lease.task)
        return ("unpacked", lease.task)

    def returning_slots(self) -> int:
        self.asked += 1
        return self.returning


class Workers:
    """The workers' side of the ring, played in this thread: take a slot,
    claim the next task, write the batch (or an error report, or an end
    marker) and publish it."""

    def __init__(self, ring: Ring) -> None:
        self.ring = ring

    def claim(self, worker: int) -> tuple[int, int]:
        slot = self.ring.pop_free(worker, 0.0)
        assert slot >= 0, "no free slot: the test holds too many"
        return slot, self.ring.claim_task(slot)

    def batch(self, slot: int, worker: int, value: int, pass_: int = 0) -> None:
        (rows,) = SPEC.views(self.ring.slot_view(slot), ROWS, capacity=True)
        rows[:] = value
        del rows
        assert self.ring.publish(slot, SLOT_BATCH, ROWS, pass_, worker)

    def error(
        self,
        slot: int,
        worker: int,
        exc: BaseException,
        sample: int = _report.UNKNOWN_SAMPLE,
        pass_: int = 0,
    ) -> None:
        payload = _report.encode(exc, self.ring.slot_bytes)
        memoryview(self.ring.slot_view(slot))[: len(payload)] = payload
        assert self.ring.publish(
            slot, SLOT_ERROR, 0, pass_, worker, sample, len(payload)
        )

    def end(self, slot: int, worker: int, pass_: int = 0) -> None:
        assert self.ring.publish(slot, SLOT_END, 0, pass_, worker)

    def make(self, worker: int, value: int | None = None) -> int:
        """Claims and publishes one batch (its value: 100 + its task)."""
        slot, task = self.claim(worker)
        self.batch(slot, worker, 100 + task if value is None else value)
        return task


@pytest.fixture
def ring() -> Iterator[Ring]:
    size = region_size(SLOTS, WORKERS, SLOT_BYTES, PAGE_SIZE)
    ring = Ring.create(mmap.mmap(-1, size), SLOTS, WORKERS, SLOT_BYTES, PAGE_SIZE, 0)
    yield ring
    ring.close()


@pytest.fixture
def owner() -> FakeOwner:
    return FakeOwner()


@pytest.fixture
def pool(ring: Ring) -> FakePool:
    return FakePool(ring)


@pytest.fixture
def workers(ring: Ring) -> Workers:
    return Workers(ring)


def sampler(batches: int = 3) -> EpochSampler:
    return EpochSampler(
        batches * ROWS,
        ROWS,
        shuffle=False,
        seed=0,
        drop_last=False,
        rank=0,
        world_size=1,
    )


def make_feed(
    ring: Ring,
    pool: FakePool,
    owner: FakeOwner,
    *,
    batches: int | None = 3,
    ordered: bool = True,
    timeout: float | None = None,
    fatal_errors: bool = True,
    views: bool = False,
    spec: Any = SPEC,
) -> Feed:
    return Feed(
        ring,
        pool,  # type: ignore[arg-type]
        spec,
        None if batches is None else sampler(batches),
        ordered=ordered,
        timeout=timeout,
        copy=False,
        spin_s=0.001,
        owner=owner,
        fatal_errors=fatal_errors,
        views=spec.batch_views(None) if views else None,
    )


@contextlib.contextmanager
def after(seconds: float, action: Callable[[], Any]) -> Iterator[None]:
    """Runs ``action`` on another thread ``seconds`` into the block (while
    the loop waits in it), and joins that thread when the block ends."""
    timer = threading.Timer(seconds, action)
    timer.start()
    try:
        yield
    finally:
        timer.join()


def value(batch: Any) -> int:
    """The batch's value, from the owner's batch or the compiled one."""
    array = batch[0] if isinstance(batch, list) else batch
    assert (array == array[0]).all()
    return int(array[0])


# ------------------------------------------------------------ order


@pytest.mark.parametrize("views", [False, True], ids=["full-path", "compiled"])
def test_batches_made_out_of_order_come_out_in_task_order(
    ring: Ring, pool: FakePool, owner: FakeOwner, workers: Workers, views: bool
) -> None:
    feed = make_feed(ring, pool, owner, views=views)
    claims = [workers.claim(w) for w in (0, 1, 0)]
    for slot, task in (claims[2], claims[0], claims[1]):
        workers.batch(slot, task % WORKERS, 100 + task)
    assert [value(b) for b in feed.begin_epoch()] == [100, 101, 102]
    assert owner.made == (0 if views else 3)
    assert feed.epochs.finished and feed.epochs.place(feed.consumer.handed) == (
        1,
        0,
        None,
    )


@pytest.mark.parametrize("views", [False, True], ids=["full-path", "compiled"])
def test_unordered_batches_come_out_as_they_are_made(
    ring: Ring, pool: FakePool, owner: FakeOwner, workers: Workers, views: bool
) -> None:
    feed = make_feed(ring, pool, owner, ordered=False, views=views)
    claims = [workers.claim(w) for w in (0, 1, 0)]
    for slot, task in (claims[2], claims[0], claims[1]):
        workers.batch(slot, task % WORKERS, 100 + task)
    it = feed.begin_epoch()
    assert value(next(it)) == 102
    # Saved now: batch 2 is past the prefix (none) of the epoch.
    assert feed.epochs.place(feed.consumer.handed) == (0, 0, [2])
    assert [value(b) for b in it] == [100, 101]


def test_a_resumed_epoch_starts_the_workers_at_its_first_batch(
    ring: Ring, pool: FakePool, owner: FakeOwner, workers: Workers
) -> None:
    feed = make_feed(ring, pool, owner)
    feed.epochs.resume_at(Resume(1, 2, frozenset(), None))
    it = feed.begin_epoch()
    assert ring.next_task == 5, "the skipped batches must never be made"
    assert workers.make(0) == 5
    assert [value(b) for b in it] == [105]
    assert feed.epochs.place(feed.consumer.handed) == (2, 0, None)


@pytest.mark.parametrize("views", [False, True], ids=["full-path", "compiled"])
def test_batches_delivered_before_an_unordered_state_are_dropped(
    ring: Ring, pool: FakePool, owner: FakeOwner, workers: Workers, views: bool
) -> None:
    feed = make_feed(ring, pool, owner, ordered=False, views=views)
    feed.epochs.resume_at(Resume(0, 0, frozenset({1}), None))
    it = feed.begin_epoch()
    for w in (0, 1, 0):
        workers.make(w)
    assert [value(b) for b in it] == [100, 102]
    assert feed.epochs.place(feed.consumer.handed) == (1, 0, [])


def test_a_packed_slot_is_unpacked_by_the_owner(
    ring: Ring, pool: FakePool, owner: FakeOwner, workers: Workers
) -> None:
    feed = make_feed(ring, pool, owner, batches=None, spec=PackedSpec(SLOT_BYTES))
    slot, task = workers.claim(1)
    assert ring.publish(slot, SLOT_BATCH, 10, 0, 1, 0, 10)
    batch = feed.hand_out(feed.next_lease(0, 1))
    feed.consumer.pending = -1
    assert batch == ("unpacked", task) and owner.unpacked == [task]
    assert owner.made == 0


# ------------------------------------------------------------ passes


def test_a_pass_ends_when_every_workers_stream_has(
    ring: Ring, pool: FakePool, owner: FakeOwner, workers: Workers
) -> None:
    feed = make_feed(ring, pool, owner, batches=None)
    feed.passes.resume_at(StreamResume(3, [5, 2]))  # a loaded state
    it = feed.begin_pass()
    workers.make(0, 10)
    workers.make(1, 20)
    workers.make(0, 11)
    slot, _ = workers.claim(1)
    workers.end(slot, 1)
    assert [value(next(it)), value(next(it))] == [10, 20]
    assert feed.stream_place() == StreamResume(3, [6, 3])
    slot, _ = workers.claim(0)
    workers.end(slot, 0)
    assert [value(b) for b in it] == [11]
    # Between passes: the next one starts afresh.
    assert feed.stream_place() == StreamResume(4, [0, 0])
    feed.begin_pass()
    assert ring.pass_ == 1


# ------------------------------------------------------------ errors


@pytest.mark.parametrize("fatal", [True, False], ids=["fatal", "loop-goes-on"])
def test_an_error_slot_becomes_the_workers_exception_at_its_turn(
    ring: Ring,
    pool: FakePool,
    owner: FakeOwner,
    workers: Workers,
    fatal: bool,
) -> None:
    feed = make_feed(ring, pool, owner, fatal_errors=fatal)
    it = feed.begin_epoch()
    workers.make(0)
    slot, _ = workers.claim(1)
    workers.error(slot, 1, ValueError("bad sample"), sample=1)
    workers.make(0)
    assert value(next(it)) == 100
    with pytest.raises(WorkerError) as info:
        next(it)
    err = info.value
    # Task 1's indices are 4..7: its row 1 is sample 5.
    assert str(err).startswith(
        "worker 1 (pid 4243) raised builtins.ValueError while producing "
        "batch 1, sample 5: bad sample\n\nRemote traceback:\n"
    )
    assert (err.worker, err.task, err.sample) == (1, 1, 5)
    assert isinstance(err.__cause__, ValueError)
    assert err.__cause__.args == ("bad sample",)
    assert owner.failed == ([err] if fatal else [])
    if not fatal:
        assert [value(b) for b in it] == [102]


def test_a_streams_error_names_its_place_in_the_workers_stream(
    ring: Ring, pool: FakePool, owner: FakeOwner, workers: Workers
) -> None:
    feed = make_feed(ring, pool, owner, batches=None, fatal_errors=False)
    it = feed.begin_pass()
    workers.make(1, 20)
    slot, _ = workers.claim(1)
    workers.error(slot, 1, KeyError("k"))
    assert value(next(it)) == 20
    with pytest.raises(WorkerError, match=r"^worker 1 \(pid 4243\) raised ") as info:
        next(it)
    assert "while producing batch 1 of worker 1's stream in this pass: " in str(
        info.value
    )
    assert info.value.task == -1


def test_a_timeout_names_the_worker_on_the_batch_waited_for(
    ring: Ring, pool: FakePool, owner: FakeOwner, workers: Workers
) -> None:
    feed = make_feed(ring, pool, owner, timeout=0.2)
    it = feed.begin_epoch()
    workers.claim(0)  # task 0, never published
    pool.stacks[0] = '  File "make.py", line 3, in make\n'
    t0 = time.monotonic()
    with pytest.raises(FetchTimeout) as info:
        next(it)
    assert time.monotonic() - t0 >= 0.2
    assert str(info.value) == (
        "no batch within timeout=0.2 s: worker 0 (pid 4242) is still on "
        'batch 0. Its Python stack:\nFile "make.py", line 3, in make\n'
        "\nRaise timeout= if batches are legitimately slow."
    )
    assert (info.value.worker, info.value.task) == (0, 0)
    assert owner.failed == [info.value]
    assert owner.asked >= 1, "the owner's returning slots are counted before a sleep"


def test_a_consumer_holding_every_slot_is_told_so(
    ring: Ring, pool: FakePool, owner: FakeOwner, workers: Workers
) -> None:
    feed = make_feed(ring, pool, owner, batches=SLOTS + 2)
    it = feed.begin_epoch()
    for w in range(SLOTS):
        workers.make(w % WORKERS)
    kept = [next(it) for _ in range(SLOTS)]
    with pytest.raises(SlotsExhausted) as info:
        next(it)
    assert str(info.value) == (
        f"all {SLOTS} slots are held ({SLOTS} by batches you still reference, "
        "0 waiting their turn), so no worker can produce the next batch. Drop "
        "references to earlier batches (or copy what you keep: np.array(x)), "
        "pass copy=True, or raise slots="
    )
    assert owner.failed == [], "running out of slots does not close"
    del kept[0]
    assert ring.pop_free(0, 0.0) >= 0, "a dropped batch frees its slot"


def test_slots_on_their_way_back_from_the_device_are_waited_for(
    ring: Ring, pool: FakePool, owner: FakeOwner, workers: Workers
) -> None:
    """Every slot is the consumer's, but one only waits for the GPU to read
    it (a pinned ring's): it comes back without the loop, so the consumer
    waits for the next batch instead of saying the slots are exhausted."""
    feed = make_feed(ring, pool, owner, batches=SLOTS + 2, timeout=0.2)
    it = feed.begin_epoch()
    for w in range(SLOTS):
        workers.make(w % WORKERS)
    kept = [next(it) for _ in range(SLOTS)]
    owner.returning = 1
    with pytest.raises(FetchTimeout):
        next(it)
    assert owner.asked >= 1
    del kept


def test_a_dead_worker_is_raised_even_with_the_next_batch_here(
    ring: Ring, pool: FakePool, owner: FakeOwner, workers: Workers
) -> None:
    feed = make_feed(ring, pool, owner)
    it = feed.begin_epoch()
    workers.make(0)
    pool.failure = WorkerDied("worker 1 (pid 4243) was killed", worker=1, pid=4243)
    with pytest.raises(WorkerDied) as info:
        next(it)
    assert info.value is pool.failure
    assert str(info.value) == "worker 1 (pid 4243) was killed"
    assert owner.failed == [info.value]


@pytest.mark.parametrize("ordered", [True, False], ids=["ordered", "unordered"])
def test_a_worker_dead_mid_claim_is_named_with_the_batch_it_took(
    ring: Ring, pool: FakePool, owner: FakeOwner, ordered: bool
) -> None:
    feed = make_feed(ring, pool, owner, ordered=ordered)
    it = feed.begin_epoch()
    # Worker 1 took a slot and claimed task 0, and died before recording it.
    assert ring.pop_free(1, 0.0) >= 0
    ring.skip_tasks_to(1)
    pool.failure = WorkerDied(
        "worker 1 (pid 4243) was killed", worker=1, pid=4243, claiming=True
    )
    with pytest.raises(WorkerDied) as info:
        next(it)
    if ordered:
        assert str(info.value) == (
            "worker 1 (pid 4243) was killed; batch 0, which it had just "
            "claimed, is lost with it"
        )
        assert info.value.task == 0
    else:  # no batch is waited for in particular
        assert str(info.value) == "worker 1 (pid 4243) was killed"
        assert info.value.task is None


def test_a_death_wakes_the_sleeping_loop(
    ring: Ring, pool: FakePool, owner: FakeOwner, workers: Workers
) -> None:
    feed = make_feed(ring, pool, owner)
    it = feed.begin_epoch()
    workers.claim(0)  # task 0: its worker dies making it
    died = WorkerDied("worker 0 (pid 4242) was killed", worker=0, pid=4242)

    def die() -> None:
        pool.failure = died
        ring.alert()  # as the pool's death watch does

    with after(0.2, die), pytest.raises(WorkerDied) as info:
        next(it)
    assert info.value is died and owner.failed == [died]


def test_a_ring_closed_while_waiting_ends_the_wait(
    ring: Ring, pool: FakePool, owner: FakeOwner, workers: Workers
) -> None:
    feed = make_feed(ring, pool, owner)
    it = feed.begin_epoch()
    workers.claim(0)
    closed = "^the Prefetcher was closed while waiting for a batch$"
    with after(0.2, ring.close), pytest.raises(PrefetcherClosed, match=closed):
        next(it)
    assert owner.failed == []


def test_closing_ends_the_current_loop_with_an_error_and_older_ones_quietly(
    ring: Ring, pool: FakePool, owner: FakeOwner, workers: Workers
) -> None:
    feed = make_feed(ring, pool, owner)
    old = feed.begin_epoch()
    current = feed.begin_epoch()
    workers.make(0)
    feed.close_loops("closed for the test")
    with pytest.raises(StopIteration):
        next(old)
    with pytest.raises(PrefetcherClosed, match="^closed for the test$"):
        next(current)


# ------------------------------------------------------------ interrupts


class Interrupter:
    """Sends SIGINT at the ``at``-th point of a next() where CPython may
    run a signal handler, whose KeyboardInterrupt comes out there as that
    of a Ctrl+C landing there does: the start of a Python function, and the
    return of a call into compiled code (a builtin's, which a profile
    function sees, or a Consumer method's, which it does not:
    ConsumerStandIn counts those). Points in this file's own code are not
    counted."""

    def __init__(self, at: int) -> None:
        self.left = at
        self.fired = False

    def point(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.fired = True
            signal.raise_signal(signal.SIGINT)  # its handler runs at once

    def profile(self, frame: Any, event: str, arg: Any) -> None:
        if event in ("call", "c_return") and frame.f_code.co_filename != __file__:
            self.point()


class ConsumerStandIn:
    """A Feed's Consumer whose every method call, once it has returned, is
    one of the Interrupter's points."""

    def __init__(self, consumer: Any, interrupter: Interrupter) -> None:
        object.__setattr__(self, "_consumer", consumer)
        object.__setattr__(self, "_interrupter", interrupter)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._consumer, name)
        if not callable(attr):
            return attr

        def call(*args: Any) -> Any:
            result = attr(*args)
            self._interrupter.point()
            return result

        return call

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._consumer, name, value)


def next_interrupted(feed: Feed, it: Iterator[Any], at: int) -> tuple[bool, Any]:
    """next(it), with a KeyboardInterrupt at its ``at``-th point: (whether
    one came, the batch if none did)."""
    interrupter = Interrupter(at)
    consumer = feed.consumer
    feed.consumer = ConsumerStandIn(consumer, interrupter)  # type: ignore[assignment]
    sys.setprofile(interrupter.profile)
    try:
        batch = next(it)
    except KeyboardInterrupt:
        assert interrupter.fired
        return True, None
    finally:
        sys.setprofile(None)
        feed.consumer = consumer
    assert not interrupter.fired, "an interrupt was swallowed"
    return False, batch


@pytest.mark.parametrize("ordered", [True, False], ids=["ordered", "unordered"])
@pytest.mark.parametrize("views", [False, True], ids=["full-path", "compiled"])
def test_an_interrupt_anywhere_in_next_costs_the_epoch_no_batch(
    ring: Ring,
    pool: FakePool,
    owner: FakeOwner,
    workers: Workers,
    views: bool,
    ordered: bool,
) -> None:
    """A KeyboardInterrupt at each point of next() in turn, one epoch each:
    the same iterator then yields the batch it was handing out, and the
    epoch is whole, in order, each batch counted once."""
    feed = make_feed(ring, pool, owner, views=views, ordered=ordered)
    at = 0
    interrupted = True
    while interrupted:  # until next() has fewer points than `at`
        at += 1
        it = feed.begin_epoch()
        tasks = [workers.make(w) for w in (0, 1, 0)]
        interrupted, batch = next_interrupted(feed, it, at)
        got = [] if interrupted else [batch]
        got += list(it)
        assert [value(b) for b in got] == [100 + t for t in tasks], f"point {at}"
        del batch, got
        assert feed.consumer.held == 0 and feed.consumer.audit()[1] == -1
        assert feed.consumer.delivered == 3 * at, f"point {at}"
        assert feed.epochs.place(feed.consumer.handed) == (
            feed.epochs.epoch + 1,
            0,
            None if ordered else [],
        )
    assert at > 2, "next() was never interrupted past its start"


@pytest.mark.parametrize("ordered", [True, False], ids=["ordered", "unordered"])
@pytest.mark.parametrize("views", [False, True], ids=["full-path", "compiled"])
def test_a_state_saved_after_an_interrupted_next_counts_only_batches_handed_out(
    ring: Ring,
    pool: FakePool,
    owner: FakeOwner,
    workers: Workers,
    views: bool,
    ordered: bool,
) -> None:
    """A Ctrl+C inside next(), caught by a loop that saves its state to
    resume later: the batch left pending is not in that state, so the
    resumed run gets it (it would be lost otherwise)."""
    feed = make_feed(ring, pool, owner, views=views, ordered=ordered)
    at = 0
    interrupted = True
    while interrupted:
        at += 1
        it = feed.begin_epoch()
        for w in (0, 1, 0):
            workers.make(w)
        interrupted, batch = next_interrupted(feed, it, at)
        epoch = feed.epochs.epoch
        done = 0 if interrupted else 1
        assert feed.epoch_place() == (epoch, done, None if ordered else []), (
            f"point {at}"
        )
        del batch
        assert len(list(it)) == 3 - done
    assert at > 2, "next() was never interrupted past its start"


@pytest.mark.parametrize("views", [False, True], ids=["full-path", "compiled"])
def test_an_interrupt_anywhere_in_next_costs_a_pass_no_item(
    ring: Ring, pool: FakePool, owner: FakeOwner, workers: Workers, views: bool
) -> None:
    """The same for a stream: each worker's items of the pass, as a state
    saved mid-pass records them, count the interrupted one once."""
    feed = make_feed(ring, pool, owner, batches=None, views=views)
    at = 0
    interrupted = True
    while interrupted:
        at += 1
        it = feed.begin_pass()
        pass_ = ring.pass_
        for w in (0, 1):
            slot, _ = workers.claim(w)
            workers.batch(slot, w, 10 * (w + 1), pass_)
        for w in (0, 1):
            slot, _ = workers.claim(w)
            workers.end(slot, w, pass_)
        interrupted, batch = next_interrupted(feed, it, at)
        got = [] if interrupted else [batch]
        got += islice(it, 2 - len(got))
        assert [value(b) for b in got] == [10, 20], f"point {at}"
        assert feed.stream_place() == StreamResume(pass_, [1, 1]), f"point {at}"
        assert list(it) == []
        del batch, got
        assert feed.consumer.held == 0 and feed.consumer.audit()[1] == -1
        assert feed.consumer.delivered == 2 * at, f"point {at}"
    assert at > 2, "next() was never interrupted past its start"


# ------------------------------------------------------------ the owner


def test_the_feed_does_not_keep_its_owner_alive(ring: Ring, pool: FakePool) -> None:
    owner = FakeOwner()
    feed = make_feed(ring, pool, owner)
    gone = weakref.ref(owner)
    del owner
    gc.collect()
    assert gone() is None
    with pytest.raises(ReferenceError):
        feed.owner.returning_slots()
