"""The Feed's stand-ins for the tests in this folder: a real ring on a
private mapping of this process, a fake pool and a fake owner, and this
thread playing the workers' side of the ring as fastq/_workers/_worker.py's
producer does (the fixtures over them are in conftest.py)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import numpy as np

from fastq._core import _report
from fastq._core._ring import (
    NO_TASK,
    OWNER_WORKER,
    SLOT_BATCH,
    SLOT_END,
    SLOT_ERROR,
    Ring,
    SlotLease,
)
from fastq._layout._spec import BatchSpec
from fastq._loop._consumer import Feed
from fastq._make._sampler import EpochSampler
from fastq.errors import (
    WorkerDied,
)

SLOTS = 4
WORKERS = 2
SLOT_BYTES = 64 * 1024  # room for an error report, as the Prefetcher's
ROWS = 4
SPEC = BatchSpec.from_user(((), "int64"), rows=ROWS)
PIDS = [4242, 4243]


class FakePool:
    """What a Feed reads of its WorkerPool: ``failure``, ``pids``,
    ``size``, ``holders()`` (from the census, as the pool's),
    ``stack_of()`` and ``check_deaths()`` (which finds ``dead``: a death
    the pool's watching thread has not reported yet)."""

    def __init__(self, ring: Ring) -> None:
        self.ring = ring
        self.failure: WorkerDied | None = None
        self.dead: WorkerDied | None = None
        self.pids = list(PIDS)
        self.stacks: dict[int, str] = {}

    def check_deaths(self) -> None:
        if self.failure is None and self.dead is not None:
            self.failure = self.dead

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
