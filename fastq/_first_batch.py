"""The batch a worker makes before the ring exists, to infer the slots'
layout from: which task it is, the consumer's wait for its spec, and the
claim that delivers it without making it again."""

from __future__ import annotations

from typing import Any

from . import _report
from ._diagnosis import batch_error
from ._handshake import Answer, FirstItemFailed, SpecFound, WorkerInitFailed
from ._plan import Plan
from ._ring import Ring
from ._sampler import EpochSampler
from ._spec import BatchSpec
from ._state import Resume
from .errors import RingError

# NOTE [ The kept first batch ]
#
# Without spec=, a map-style source's spec comes from the first batch of
# the run (task `first`: the epoch's first, or a state's next), which
# worker 0 makes before the ring exists, as any batch is made, and keeps
# (fastq._map_fill.MapFill.begin_first: the spec goes to the consumer
# after the first sample, and end_first makes the rest while the ring is
# built); a DataLoader's engine (fastq._planned) sizes its slots from a
# first batch the same way. Making it again in the ring would call
# __getitem__ twice for its samples, so the task belongs to the worker
# that made it: once the ring exists, and before any worker has it, the
# consumer takes a slot on that worker's behalf and claims `first` with
# it (claim_kept). The census then records the worker holding that slot
# and task (a death names the batch, a timeout shows its stack), and the
# worker finds the slot there and delivers the kept batch before its loop
# (fastq._worker_loops.Producer._kept_slot).
#
# Deadlock freedom (DESIGN.md section 3) holds as for any claim: the
# lowest task holds a slot from the start, and every later one is claimed
# after it, holding its own; the worker needs no other slot to deliver,
# and worker 0 is never parked (workers="auto" keeps at least one).


def first_plan(sampler: EpochSampler, resume: Resume | None) -> Plan:
    """The task whose batch worker 0 makes first: the first of the run, or
    of what is left of it after a state (never the batches it skips)."""
    task = 0
    if resume is not None:
        task = resume.epoch * sampler.batches_per_epoch + resume.first
    epoch, batch = sampler.locate(task)
    return Plan(task, epoch, batch, sampler.batch_indices(task).tolist())


def receive_map_spec(pool: Any, first: Plan, timeout: float | None) -> BatchSpec:
    """The spec worker 0 inferred from its first sample. Raises what went
    wrong before it: the source's exception as at that batch's turn
    (naming the batch and sample), worker_init's, a death or a timeout."""
    answer: Answer = pool.receive_first(0, timeout)
    if isinstance(answer, SpecFound):
        spec: BatchSpec = answer.spec
        return spec
    if isinstance(answer, FirstItemFailed):
        raise batch_error(
            _report.decode(answer.report),
            worker=0,
            pid=pool.pids[0],
            task=first.task,
            position=answer.position,
            indices=first.indices,
        )
    assert isinstance(answer, WorkerInitFailed)  # a map-style stream never ends
    raise _report.decode(answer.report).error(  # worker_init failed
        worker=0, pid=pool.pids[0], where="its first batch, in worker_init"
    )


def claim_kept(ring: Ring, worker: int, task: int) -> None:
    """Claims `task` with a slot for `worker`, which made its batch before
    the ring existed; before any worker has the ring."""
    ring.skip_tasks_to(task)
    slot = ring.pop_free(worker, 0.0)
    claimed = ring.claim_task(slot) if slot >= 0 else -1
    if claimed != task:
        raise RingError(
            f"the new ring gave worker {worker} slot {slot} and task {claimed} "
            f"for the batch it made before the ring existed, task {task}"
        )
