"""The Feed alone, without processes (feed_fakes.py): each way a fetch
fails."""

from __future__ import annotations

import time
from itertools import islice

import pytest
from feed_fakes import (
    SLOTS,
    WORKERS,
    FakeOwner,
    FakePool,
    Workers,
    after,
    make_feed,
    value,
)

from fastq._core._ring import (
    Ring,
)
from fastq.errors import (
    FetchTimeout,
    PrefetcherClosed,
    SlotsExhausted,
    WorkerDied,
    WorkerError,
)

pytestmark = pytest.mark.timeout(60)


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


@pytest.mark.parametrize("views", [False, True], ids=["full-path", "compiled"])
def test_a_death_not_yet_reported_ends_the_epoch_with_it(
    ring: Ring, pool: FakePool, owner: FakeOwner, workers: Workers, views: bool
) -> None:
    """Every batch of the epoch was made before a worker died, and the
    pool's watching thread has not run since (a loaded machine): the epoch
    does not end as a clean one, its end raises the death."""
    feed = make_feed(ring, pool, owner, views=views)
    it = feed.begin_epoch()
    for w in (0, 1, 0):
        workers.make(w)
    pool.dead = WorkerDied("worker 1 (pid 4243) was killed", worker=1, pid=4243)
    assert [value(b) for b in islice(it, 3)] == [100, 101, 102]
    with pytest.raises(WorkerDied, match=r"^worker 1 \(pid 4243\) was killed"):
        next(it)
    assert owner.failed == [pool.dead]


def test_a_death_not_yet_reported_ends_the_pass_with_it(
    ring: Ring, pool: FakePool, owner: FakeOwner, workers: Workers
) -> None:
    feed = make_feed(ring, pool, owner, batches=None)
    it = feed.begin_pass()
    pass_ = ring.pass_
    for w in (0, 1):
        slot, _ = workers.claim(w)
        workers.end(slot, w, pass_)
    pool.dead = WorkerDied("worker 0 (pid 4242) was killed", worker=0, pid=4242)
    with pytest.raises(WorkerDied, match="worker 0"):
        next(it)


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
