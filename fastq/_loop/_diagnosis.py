"""What went wrong, in words: the exceptions for a worker's error report, a
dead worker, a timeout and a slot census that does not add up, built from
the ring, the pool and the consumer's books. The Feed decides when to raise
them."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .._core import _report
from .._core._ring import (
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
    Consumer,
    Ring,
    SlotLease,
)
from .._workers._handshake import FirstItemFailed, WorkerInitFailed
from ..errors import FetchTimeout, RingError, SlotsExhausted, WorkerDied

if TYPE_CHECKING:
    from .._workers._pool import WorkerPool

_LOCAL_NAMES = {
    LOCAL_NONE: "not its own",
    LOCAL_WINDOW: "waiting in the reorder window",
    LOCAL_PENDING: "being handed out",
    LOCAL_LEASED: "handed out",
    LOCAL_DEFERRED: "released, its return deferred",
}


# ------------------------------------------------------------ census


def slots_exhausted(consumer: Consumer, nslots: int) -> SlotsExhausted:
    """The consumer holds all ``nslots`` slots: no worker can make the
    next batch."""
    return SlotsExhausted(
        f"all {nslots} slots are held ({consumer.held} by batches you still "
        f"reference, {consumer.in_window} waiting their turn), so no worker can "
        "produce the next batch. Drop references to earlier batches (or "
        "copy what you keep: np.array(x)), pass copy=True, or raise slots="
    )


def lost_slot(ring: Ring, consumer: Consumer, slot: int) -> RingError:
    """The shared census and this process's books disagree on ``slot``."""
    kind, who, task = ring.census()[slot]
    local = _LOCAL_NAMES[consumer.local_states()[slot]]
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


# ------------------------------------------------------------ workers


def worker_error(
    lease: SlotLease,
    *,
    pool: WorkerPool,
    consumer: Consumer,
    indices_of: Callable[[int], Any] | None,
    sample_stream: bool,
) -> Exception:
    """The error a worker published in place of a batch. ``indices_of``
    names a task's sample indices; None for a stream, whose error names the
    place in the worker's own stream instead."""
    task, worker = lease.task, lease.worker
    report = _report.decode(memoryview(lease)[: lease.payload_bytes])
    indices: Any = None
    stream_place = None
    if indices_of is not None:
        indices = indices_of(task)
    else:
        # A stream: the ring's task count means nothing to the user; the
        # place in the worker's own stream does (each worker's items are
        # handed out in its order; the failed one is counted as it is
        # handed out, after this).
        stream_place = consumer.items[worker]
    return batch_error(
        report,
        worker=worker,
        pid=pool.pids[worker % pool.size],  # a stream's lane runs there
        task=task,
        position=lease.sample,
        indices=indices,
        stream_place=stream_place,
        sample_stream=sample_stream,
    )


def init_failed(
    answer: WorkerInitFailed, *, worker: int, pid: int, where: str
) -> Exception:
    """worker_init's exception, reported before the ring existed."""
    return _report.decode(answer.report).error(worker=worker, pid=pid, where=where)


def first_item_failed(
    answer: FirstItemFailed, *, worker: int, pid: int, task: int, indices: Any
) -> Exception:
    """The exception for a first batch that failed before the ring existed
    (its sample at the answer's position, when known)."""
    return batch_error(
        _report.decode(answer.report),
        worker=worker,
        pid=pid,
        task=task,
        position=answer.position,
        indices=indices,
    )


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


def worker_died(
    failure: WorkerDied, ring: Ring, consumer: Consumer, *, ordered: bool
) -> WorkerDied:
    """``failure``, naming the batch a worker that died mid-claim took
    with it: its claim was made, its record not, so it is the task the
    loop waits for that no slot records."""
    if failure.task is not None or not failure.claiming or not ordered:
        return failure
    census = ring.census()
    if any(
        kind == OWNER_WORKER and task == NO_TASK and who != failure.worker
        for kind, who, task in census
    ):
        # Another worker is between its pop and its record too: the
        # unrecorded batch may be its, so none is named.
        return failure
    recorded = {t for _, _, t in census if t != NO_TASK}
    for task in range(consumer.next_task, ring.next_task):
        if task not in recorded:
            failure.task = task
            failure.args = (
                f"{failure.args[0]}; batch {task}, which it had just "
                "claimed, is lost with it",
            )
            break
    return failure


def timeout_error(
    pool: WorkerPool, consumer: Consumer, *, ordered: bool, timeout: float | None
) -> FetchTimeout:
    """No batch within ``timeout``: names the worker on the batch the loop
    waits for (else the oldest one in the making) with its Python stack,
    or the freed slots a stopped worker keeps from the queue."""
    holders = pool.holders()
    wanted = consumer.next_task if ordered else None
    stuck = next((w for w, t in holders if t == wanted), None)
    if stuck is None and holders:
        stuck = min(holders, key=lambda h: h[1])[0]
    detail = ""
    if stuck is not None:
        pid = pool.pids[stuck]
        task = dict(holders)[stuck]
        stack = pool.stack_of(stuck).strip()
        detail = f": worker {stuck} (pid {pid}) is still on batch {task}"
        if stack:
            detail += f". Its Python stack:\n{stack}\n"
    elif consumer.ndeferred:
        detail = (
            f": {consumer.ndeferred} freed slot(s) wait for a worker "
            "stopped inside a queue operation (a debugger, SIGSTOP or CPU "
            "throttling)"
        )
    return FetchTimeout(
        f"no batch within timeout={timeout} s{detail}\nRaise timeout= "
        "if batches are legitimately slow.",
        worker=stuck,
        task=wanted if wanted is not None else -1,
    )
