"""A DataLoader's first batches, before its ring exists: its slots are sized
from the first batch a worker makes. A planned source's workers all begin
their first tasks at once; if every one fails, and for an iterable source,
the workers are asked for first batches one at a time, through their
sockets, as DataLoader would take them; each failed one is raised at its
turn."""

from __future__ import annotations

import time
from typing import Callable

from .._core._plan import Plan
from .._layout._packing import PackedSpec
from .._loop._diagnosis import first_item_failed, init_failed
from .._loop._planner import Planner
from .._workers._handshake import (
    FirstItemFailed,
    Probe,
    ProbeStream,
    ProbeTask,
    SpecFound,
    StreamEmpty,
    WorkerInitFailed,
)
from .._workers._pool import WorkerPool
from ._first_batch import lowest_init_failure

# Where a worker_init_fn's exception is said to have come from.
_INIT = "its worker_init_fn"


class FirstBatchProber:
    """Asks for first batches until one is made: a planned source's next
    task (``planner``), or an iterable's next worker in turn. ``found``
    builds the ring from the first spec, given the (worker, task) whose
    batches (or errors) their workers keep, in task order (none for an
    iterable), and the worker that found it.

    A planned source's workers make ``round`` (worker w: ``round[w]``)
    unasked, an iterable's worker 0 its first item; ``answer`` awaits
    them.
    """

    def __init__(
        self,
        pool: WorkerPool,
        planner: Planner | None,
        *,
        workers: int,
        timeout: float | None,
        found: Callable[[PackedSpec, list[tuple[int, Plan]], int], None],
        round: list[Plan],
    ) -> None:
        self._pool = pool
        self._planner = planner
        self._workers = workers
        self._timeout = timeout
        self._found = found
        # The first round: each worker's first task, whose answers are due
        # in any order (worker -> plan), and its tasks that failed so far.
        self._round = dict(enumerate(round))
        self._round_plans = list(round)
        self._round_failed: dict[int, FirstItemFailed] = {}
        self.asked: int | None = None if round else 0  # whose answer is due
        self._asked_plan: Plan | None = None  # the task whose answer is due
        self._probed = 0  # the worker asked last
        # An iterable source's workers whose stream has not ended, and
        # those asked already (the others start theirs afresh when asked).
        self._streams = set(range(workers))
        self._started = {0}
        self.errors: list[Exception] = []  # those to raise, in order
        self.handed = 0  # errors raised so far
        self.ended = False  # no first batch is left to ask for
        # Each worker's turns used by failed first batches (an iterable in
        # order: its batches then come in turn, fastq/_core/_turns.py).
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
        if self._round:
            self._answer_round()
            return
        while True:
            worker, held = self.asked, self._asked_plan
            task = -1 if held is None else held.task
            assert worker is not None
            answer = pool.receive_first(worker, self._timeout)
            self.asked = None
            if isinstance(answer, SpecFound):
                self._found(
                    answer.spec, [] if held is None else [(worker, held)], worker
                )
                return
            if isinstance(answer, FirstItemFailed):
                if self._planner is None:
                    self.turns_used[worker] += 1
                self.errors.append(self._error(worker, task, answer))
                return
            if isinstance(answer, StreamEmpty):  # an iterable's worker has no more
                self._streams.discard(worker)
                if self.ask():
                    continue
                if initial:
                    raise pool.empty_error()
                self.ended = True
                return
            raise init_failed(answer, worker=worker, pid=pool.pids[worker], where=_INIT)

    def _error(self, worker: int, task: int, answer: FirstItemFailed) -> Exception:
        indices = None
        if self._planner is not None:
            indices = self._planner.indices.pop(task, None)
        return first_item_failed(
            answer,
            worker=worker,
            pid=self._pool.pids[worker],
            task=task,
            indices=indices,
        )

    def _answer_round(self) -> None:
        """Waits for the first round's answers until one has a spec: the
        ring is then built, and every task of the round is kept by its
        worker (a failed one too, raised at its turn from the ring). If
        every one failed, their errors wait to be raised in task order,
        and the tasks after them are asked for one at a time."""
        pool = self._pool
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        while self._round:
            worker, answer = pool.receive_any(
                list(self._round), self._timeout, deadline=deadline
            )
            if isinstance(answer, SpecFound):
                self._round.clear()
                kept = list(enumerate(self._round_plans))
                self._found(answer.spec, kept, worker)
                return
            del self._round[worker]
            if isinstance(answer, WorkerInitFailed):
                raise lowest_init_failure(
                    pool,
                    worker,
                    answer,
                    list(self._round),
                    self._timeout,
                    deadline,
                    where=_INIT,
                )
            assert isinstance(answer, FirstItemFailed)  # a planned task
            self._round_failed[worker] = answer
        for worker, plan in enumerate(self._round_plans):
            self.errors.append(
                self._error(worker, plan.task, self._round_failed[worker])
            )
        self._round_failed.clear()

    def next_item(self, sizing: Callable[[], bool]) -> None:
        """The epoch's (or pass's) next item while ``sizing()``: raises the
        next first batch's error, or StopIteration when the epoch is over;
        returns once the ring exists."""
        while sizing():
            if self.errors:
                self.handed += 1
                error = self.errors.pop(0)
                if not self.errors and not self.ended and self.asked is None:
                    self.ask()  # the next one is made while this is handled
                try:
                    raise error
                finally:
                    del error  # no cycle through this frame
            if self.asked is None and (self.ended or not self.ask()):
                self.ended = True
                raise StopIteration
            self.answer(initial=False)
