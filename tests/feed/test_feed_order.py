"""The Feed alone, without processes (feed_fakes.py): hand-out order,
resumed epochs, a stream's passes, and its owner."""

from __future__ import annotations

import gc
import weakref

import pytest
from feed_fakes import (
    SLOT_BYTES,
    WORKERS,
    FakeOwner,
    FakePool,
    Workers,
    make_feed,
    value,
)

from fastq._core._ring import (
    SLOT_BATCH,
    Ring,
)
from fastq._layout._packing import PackedSpec
from fastq._make._state import Resume, StreamResume

pytestmark = pytest.mark.timeout(60)


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
