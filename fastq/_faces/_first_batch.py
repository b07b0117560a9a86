"""The batches workers make before the ring exists, to infer the slots'
layout from: which tasks they are, the consumer's wait for the first spec,
and the claims that deliver them without making them again."""

from __future__ import annotations

import time
from typing import Any

from .._core._plan import Plan
from .._core._ring import Ring
from .._layout._spec import BatchSpec
from .._loop._diagnosis import first_item_failed, init_failed
from .._make._sampler import EpochSampler
from .._make._state import Resume
from .._workers._handshake import FirstItemFailed, SpecFound, WorkerInitFailed
from ..errors import RingError

# NOTE [ The kept first batch ]
#
# Without spec=, a source's slots are laid out from the first item a worker
# makes, and no ring exists before. So that the ring costs no worker its
# start, every worker begins at once, as DataLoader's do: each is given a
# first task (a map-style source's tasks `first`, `first` + 1, ...: the
# run's first, or a state's next; a DataLoader's planned ones), makes its
# batch before the ring exists, as any batch is made, and keeps it
# (fastq._make._map_fill.MapFill.begin_first: the spec goes to the consumer after
# the batch's first sample, and end_first makes the rest while the ring is
# built). The first spec any worker sends sizes the ring. Making a batch
# again in the ring would call __getitem__ twice for its samples, so each
# task belongs to the worker that makes it: once the ring exists, and
# before any worker has it, the consumer takes a slot on each worker's
# behalf and claims its task with it (claim_kept), in task order. The
# census then records the worker holding that slot and task (a death names
# the batch, a timeout shows its stack), and the worker finds the slot
# there and delivers the kept batch (or its error, or a SpecError if its
# own first sample disagrees with the ring's layout) before its loop
# (fastq._workers._worker_loops.Producer._kept_slot). A first sample that fails
# is kept the same way; only when every worker's fails is there no ring,
# and the consumer raises the first task's error itself.
#
# Deadlock freedom (DESIGN.md section 3) holds as for any claim: the
# lowest task holds a slot from the start, and every later one is claimed
# after it, holding its own; a worker needs no other slot to deliver, and
# no more tasks are given out than the ring has slots.


def first_plans(
    sampler: EpochSampler, resume: Resume | None, workers: int
) -> list[Plan]:
    """The tasks the workers make first, one each: from the first of the
    run, or of what is left of it after a state (never the batches it
    skips)."""
    first = 0
    if resume is not None:
        first = resume.epoch * sampler.batches_per_epoch + resume.first
    plans = []
    for task in range(first, first + workers):
        epoch, batch = sampler.locate(task)
        plans.append(Plan(task, epoch, batch, sampler.batch_indices(task).tolist()))
    return plans


def receive_map_spec(pool: Any, plans: list[Plan], timeout: float | None) -> BatchSpec:
    """The spec the first worker to make a first sample inferred (worker w
    makes ``plans[w]``). Raises what went wrong before any did: the first
    task's exception as at that batch's turn (naming the batch and sample)
    once every worker's first sample failed, worker_init's, a death or a
    timeout."""
    waiting = list(range(len(plans)))
    failed: dict[int, FirstItemFailed] = {}
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        worker, answer = pool.receive_any(waiting, timeout, deadline=deadline)
        if isinstance(answer, SpecFound):
            spec: BatchSpec = answer.spec
            return spec
        waiting.remove(worker)
        if isinstance(answer, WorkerInitFailed):
            raise lowest_init_failure(
                pool,
                worker,
                answer,
                waiting,
                timeout,
                deadline,
                where="its first batch, in worker_init",
            )
        assert isinstance(answer, FirstItemFailed)  # a map-style stream never ends
        failed[worker] = answer
        if not waiting:
            first = plans[0]
            raise first_item_failed(
                failed[0],
                worker=0,
                pid=pool.pids[0],
                task=first.task,
                indices=first.indices,
            )


def lowest_init_failure(
    pool: Any,
    worker: int,
    answer: WorkerInitFailed,
    waiting: list[int],
    timeout: float | None,
    deadline: float | None,
    where: str,
) -> Exception:
    """The error to raise once ``worker``'s worker_init has failed while
    every worker was starting at once: that of the lowest worker whose
    worker_init failed, as DataLoader raises the first batch's error first
    whichever worker reported before it. Awaits the answers of the lower
    workers still ``waiting``; an answer that is not an init failure rules
    its worker out (the run ends all the same)."""
    lowest = (worker, answer)
    lower = [w for w in waiting if w < worker]
    while lower:
        w, other = pool.receive_any(lower, timeout, deadline=deadline)
        lower.remove(w)
        if isinstance(other, WorkerInitFailed):
            lowest = (w, other)
            lower = [v for v in lower if v < w]
    worker, answer = lowest
    return init_failed(answer, worker=worker, pid=pool.pids[worker], where=where)


def claim_kept(ring: Ring, kept: list[tuple[int, int]]) -> None:
    """Claims each (worker, task) of ``kept`` (consecutive tasks, in order)
    with a slot for its worker, which made its batch before the ring
    existed; before any worker has the ring."""
    if not kept:
        return
    ring.skip_tasks_to(kept[0][1])
    for worker, task in kept:
        slot = ring.pop_free(worker, 0.0)
        claimed = ring.claim_task(slot) if slot >= 0 else -1
        if claimed != task:
            raise RingError(
                f"the new ring gave worker {worker} slot {slot} and task "
                f"{claimed} for the batch it made before the ring existed, "
                f"task {task}"
            )
