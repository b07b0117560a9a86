"""A DataLoader's first batches, before its ring exists: its slots are sized
from the first batch a worker makes, so until one does the workers are
asked for first batches one at a time, through their sockets, as
DataLoader would take them; each failed one is raised at its turn."""

from __future__ import annotations

from typing import Callable

from . import _report
from ._diagnosis import batch_error
from ._handshake import (
    FirstItemFailed,
    Probe,
    ProbeStream,
    ProbeTask,
    SpecFound,
    StreamEmpty,
)
from ._packing import PackedSpec
from ._plan import Plan
from ._planner import Planner
from ._pool import WorkerPool


class FirstBatchProber:
    """Asks for first batches until one is made: a planned source's next
    task (``planner``), or an iterable's next worker in turn. ``found``
    builds the ring from the first spec, given the task it was made for
    (None for an iterable) and the worker that keeps the batch.

    Worker 0 makes its first item unasked (its config names the task);
    ``answer`` awaits it.
    """

    def __init__(
        self,
        pool: WorkerPool,
        planner: Planner | None,
        *,
        workers: int,
        timeout: float | None,
        found: Callable[[PackedSpec, Plan | None, int], None],
        first_plan: Plan | None,
    ) -> None:
        self._pool = pool
        self._planner = planner
        self._workers = workers
        self._timeout = timeout
        self._found = found
        self.asked: int | None = 0  # the worker whose answer is due
        self._asked_plan = first_plan  # the task whose answer is due
        self._probed = 0  # the worker asked last
        # An iterable source's workers whose stream has not ended, and
        # those asked already (the others start theirs afresh when asked).
        self._streams = set(range(workers))
        self._started = {0}
        self.error: Exception | None = None  # the next one to raise
        self.handed = 0  # errors raised so far
        self.ended = False  # no first batch is left to ask for
        # Each worker's turns used by failed first batches (an iterable in
        # order: its batches then come in turn, fastq/_turns.py).
        self.turns_used = [0] * workers

    def ask(self) -> bool:
        """Asks for the next first batch (a planned source's next task, or
        the next item of an iterable's next worker in turn, as DataLoader
        takes them); False if there is none to ask."""
        order: Probe
        if self._planner is not None:
            plan = self._planner.next_plan()
            if plan is None:
                return False
            self._asked_plan = plan
            order = ProbeTask(plan)
        else:
            after = self._probed
            turn = ((after + k) % self._workers for k in range(1, self._workers + 1))
            worker = next((w for w in turn if w in self._streams), None)
            if worker is None:
                return False
            order = ProbeStream(fresh=worker not in self._started)  # it starts now
            self._started.add(worker)
            self._probed = worker
        self._pool.ask_first(self._probed, order)
        self.asked = self._probed
        return True

    def answer(self, initial: bool = True) -> None:
        """Waits for the answer due, and acts on it: builds the ring from a
        spec; keeps a batch's error to raise at its turn; asks the next
        worker when an iterable worker has nothing. No worker with anything
        ends the pass, or (``initial``: nothing was raised yet) raises the
        EmptySource that says the source is empty."""
        pool = self._pool
        while True:
            worker, held = self.asked, self._asked_plan
            task = -1 if held is None else held.task
            assert worker is not None
            answer = pool.receive_first(worker, self._timeout)
            self.asked = None
            if isinstance(answer, SpecFound):
                self._found(answer.spec, held, worker)
                return
            if isinstance(answer, FirstItemFailed):
                if self._planner is None:
                    self.turns_used[worker] += 1
                indices = None
                if self._planner is not None:
                    indices = self._planner.indices.pop(task, None)
                self.error = batch_error(
                    _report.decode(answer.report),
                    worker=worker,
                    pid=pool.pids[worker],
                    task=task,
                    position=answer.position,
                    indices=indices,
                )
                return
            if isinstance(answer, StreamEmpty):  # an iterable's worker has no more
                self._streams.discard(worker)
                if self.ask():
                    continue
                if initial:
                    raise pool.empty_error()
                self.ended = True
                return
            raise _report.decode(answer.report).error(  # worker_init failed
                worker=worker, pid=pool.pids[worker], where="its worker_init_fn"
            )

    def next_item(self, sizing: Callable[[], bool]) -> None:
        """The epoch's (or pass's) next item while ``sizing()``: raises the
        next first batch's error, or StopIteration when the epoch is over;
        returns once the ring exists."""
        while sizing():
            if self.error is not None:
                self.handed += 1
                if not self.ended:
                    self.ask()  # the next one is made while this is handled
                error, self.error = self.error, None
                try:
                    raise error
                finally:
                    del error  # no cycle through this frame
            if self.asked is None and (self.ended or not self.ask()):
                self.ended = True
                raise StopIteration
            self.answer(initial=False)
