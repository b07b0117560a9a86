"""The Feed alone, without processes (feed_fakes.py): an interrupt at
each point of a next() costs no batch."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from itertools import islice
from typing import Any

import feed_fakes
import pytest
from feed_fakes import (
    FakeOwner,
    FakePool,
    Workers,
    make_feed,
    value,
)

from fastq._core._ring import (
    Ring,
)
from fastq._loop._consumer import Feed
from fastq._make._state import Resume, StreamResume

pytestmark = pytest.mark.timeout(60)

# The tests' own files: no point of an interrupt is counted in them.
_OURS = (__file__, feed_fakes.__file__)


class Interrupter:
    """Sends SIGINT at the ``at``-th point of a next() where CPython may
    run a signal handler, whose KeyboardInterrupt comes out there as that
    of a Ctrl+C landing there does: the start of a Python function, and the
    return of a call into compiled code (a builtin's, which a profile
    function sees, or a Consumer method's, which it does not:
    ConsumerStandIn counts those). Points in the tests' own code (this
    file's and feed_fakes.py's) are not counted."""

    def __init__(self, at: int) -> None:
        self.left = at
        self.fired = False

    def point(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.fired = True
            signal.raise_signal(signal.SIGINT)  # its handler runs at once

    def profile(self, frame: Any, event: str, arg: Any) -> None:
        if event in ("call", "c_return") and frame.f_code.co_filename not in _OURS:
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
    a state saved right then leaves the batch it was handing out to a
    resumed run (a Ctrl+C handler that saves a checkpoint), the same
    iterator then yields that batch, and the epoch is whole, in order, each
    batch counted once."""
    feed = make_feed(ring, pool, owner, views=views, ordered=ordered)
    at = 0
    interrupted = True
    while interrupted:  # until next() has fewer points than `at`
        at += 1
        it = feed.begin_epoch()
        tasks = [workers.make(w) for w in (0, 1, 0)]
        interrupted, batch = next_interrupted(feed, it, at)
        assert feed.epoch_place() == (
            feed.epochs.epoch,
            0 if interrupted else 1,
            None if ordered else [],
        ), f"point {at}"
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


@pytest.mark.parametrize("views", [False, True], ids=["full-path", "compiled"])
def test_a_state_saved_while_a_resumed_states_batch_is_dropped_keeps_it_delivered(
    ring: Ring, pool: FakePool, owner: FakeOwner, workers: Workers, views: bool
) -> None:
    """Unordered, resumed from a state that had delivered batch 1, whose
    batch arrives first: a Ctrl+C while next() drops it, then a state saved,
    still counts batch 1 delivered (a resumed run would deliver it twice
    otherwise), and the batch being handed out is not."""
    feed = make_feed(ring, pool, owner, views=views, ordered=False)
    at = 0
    interrupted = True
    while interrupted:
        at += 1
        feed.epochs.resume_at(Resume(feed.epochs.epoch + 1, 0, frozenset({1}), None))
        it = feed.begin_epoch()
        slot0, task0 = workers.claim(0)
        slot1, task1 = workers.claim(1)
        workers.batch(slot1, 1, 100 + task1)  # batch 1 comes first, and goes
        workers.batch(slot0, 0, 100 + task0)
        workers.make(0)
        interrupted, batch = next_interrupted(feed, it, at)
        epoch = feed.epochs.epoch
        if interrupted:
            assert feed.epoch_place() == (epoch, 0, [1]), f"point {at}"
        else:
            assert value(batch) == 100 + task0
            assert feed.epoch_place() == (epoch, 2, []), f"point {at}"
        del batch
        assert len(list(it)) == (2 if interrupted else 1)
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
