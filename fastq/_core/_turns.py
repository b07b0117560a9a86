"""Turns: a stream's batches in order from its workers in turn, as
DataLoader's in_order delivers an IterableDataset's (the protocol and why
it cannot deadlock: src_c/fq_ring.h, "Turns"). A worker's side: its turn's
task and slot; the consumer's: the next task, and how far workers may go."""

from __future__ import annotations

import time

from ._ring import Consumer, Ring

# A pass's tasks start at pass << PASS_SHIFT: above every task of the
# passes before it, whatever their length (up to 2**40 batches a pass, and
# 2**23 passes before a task would reach _RUNNING).
PASS_SHIFT = 40
_RUNNING = 1 << 63  # a worker's end while its stream runs


def turn_task(pass_: int, turn: int, worker: int, workers: int) -> int:
    """The task of worker ``worker``'s ``turn``-th item in pass ``pass_``."""
    return (pass_ << PASS_SHIFT) + turn * workers + worker


def take_turn(
    ring: Ring, worker: int, workers: int, pass_: int, turn: int
) -> tuple[int, int, int, int]:
    """A worker's ``turn`` of pass ``pass_``, or its turn 0 of the pass the
    consumer began since: (slot, pass, turn, wait_ns), with the turn's task
    recorded in the slot; slot < 0 once the ring is closed. The task is
    granted before a slot is taken, so a worker holds no slot while it
    waits for its turn."""
    t0 = time.perf_counter_ns()
    while True:
        current = ring.pass_
        if current != pass_:
            pass_, turn = current, 0
        task = turn_task(pass_, turn, worker, workers)
        if not ring.wait_planned(task):
            return -1, pass_, turn, 0
        if ring.pass_ == pass_:
            break  # else a new pass's grant woke it: its turn 0 then
    slot = ring.pop_free(worker)
    if slot < 0:
        return slot, pass_, turn, 0
    ring.record_task(slot, task)
    return slot, pass_, turn, time.perf_counter_ns() - t0


class Turns:
    """The consumer's side: steps its next task over the tasks no item will
    come for, and grants workers their tasks, as far as the slots its user
    does not hold allow.

    ``first`` holds each worker's turns used before the ring existed (its
    first batches that failed, each raised in its turn then): the ring's
    first pass starts each worker there.
    """

    def __init__(self, ring: Ring, consumer: Consumer, first: list[int]) -> None:
        self.ring = ring
        self.consumer = consumer
        self.workers = len(first)
        self.nslots = ring.nslots
        # The reorder window's positions (task & (span - 1)): tasks in
        # flight stay within span of the next one, so none share one.
        self.span = 1 << (ring.nslots - 1).bit_length()
        self.first = first
        self.granted = 0
        self.base = 0
        self.floor: list[int] = []  # each worker's first task in the pass
        self.end: list[int] = []  # each worker's end marker's task
        self.ended = 0
        # Tasks from here on are each a running worker's: no step needed.
        self.regular_from = 0

    def begin(self, pass_: int) -> None:
        """The consumer starts pass ``pass_``: its next task is the pass's
        first; what is left of earlier passes is dropped as it arrives."""
        base = pass_ << PASS_SHIFT
        turns = self.first if pass_ == 0 else [0] * self.workers
        w = self.workers
        self.base = base
        self.floor = [base + k * w + i for i, k in enumerate(turns)]
        self.end = [_RUNNING] * w
        self.ended = 0
        self.regular_from = max(self.floor)
        c = self.consumer
        c.next_task = base
        c.drop_below(base)
        self.advance()

    def ended_at(self, worker: int, task: int) -> None:
        """Worker ``worker``'s stream ended at ``task`` (its end marker):
        none of its later tasks will come."""
        if self.end[worker] == _RUNNING:
            self.end[worker] = task
            self.ended += 1
            self.regular_from = _RUNNING

    def advance(self) -> None:
        """Steps the next task over tasks no item will come for, then
        grants what the slots allow; before each take and each wait."""
        c = self.consumer
        task = c.next_task
        if task < self.regular_from and self.ended < self.workers:
            while not self._coming(task):
                task += 1
            c.next_task = task
        self.grant()

    def grant(self) -> None:
        """Raises the grant: tasks of running workers from the next one on,
        as many as the slots the user does not hold, within the window."""
        c = self.consumer
        budget = self.nslots - c.held
        if budget <= 0:
            return  # the user holds every slot: the census check says so
        first = c.next_task
        if first >= self.regular_from:
            limit = first + min(budget, self.span)
        else:
            limit, live = first, 0
            while live < budget and limit - first < self.span:
                live += self._coming(limit)
                limit += 1
        if limit > self.granted:
            self.granted = limit
            self.ring.set_planned(limit)

    def _coming(self, task: int) -> bool:
        """Whether an item will come for ``task`` in this pass."""
        worker = (task - self.base) % self.workers
        return self.floor[worker] <= task <= self.end[worker]


__all__ = ["PASS_SHIFT", "Turns", "take_turn", "turn_task"]
