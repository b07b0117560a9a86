"""A DataLoader's plan: the sampler's index lists taken ahead of the
workers, as DataLoader's main process takes them, numbered as tasks and
written into the ring's plan table as far as it allows."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any, Callable, NoReturn

from .._core._plan import Plan, PlanLayout, PlanTable
from .._core._ring import Ring
from ..errors import ConfigError


class Planner:
    """One epoch at a time over ``batches`` (an iterator of index lists),
    whose first is the epoch's batch ``first_batch``; the batches numbered
    in ``skip`` (delivered out of order before a resumed state) are drawn
    and dropped, unplanned. Task t is written
    only once task t - ``entries`` is done with (handed out or dropped),
    so the table never overwrites a plan a worker may still read.

    ``max_rows``: the most indices a batch may have (the slots are sized
    for it); the first ``entries`` batches are taken at once and may raise
    it. A batch with more is refused through ``fail``, which closes the
    loader and raises.
    """

    def __init__(
        self,
        batches: Iterator[Sequence[Any]],
        *,
        entries: int,
        max_rows: int,
        epoch: int,
        first_batch: int,
        ordered: bool,
        fail: Callable[[BaseException], NoReturn],
        skip: frozenset[int] = frozenset(),
    ) -> None:
        self.entries = entries
        self._fail = fail
        self.ordered = ordered
        self.ahead: deque[Sequence[Any]] = deque()  # taken, not yet planned
        self.batches: Iterator[Sequence[Any]] | None = batches
        self.exhausted = False  # the epoch's sampler has run out
        self.planned = 0  # the next task to plan
        self.epoch = epoch
        self.epoch_start = 0  # the epoch's first task
        # The epoch's batches planned, counted from its first (a resumed
        # epoch starts at first_batch: those before it were delivered).
        self.epoch_first = first_batch
        self.epoch_count = first_batch
        self.skip = skip
        self.skipped = 0  # of the epoch's batches, those dropped for skip
        # Planned tasks not yet handed out, for the errors that name them.
        self.indices: dict[int, Sequence[Any]] = {}
        # Unordered (or skipping): each planned task's batch number, until
        # handed out.
        self.numbers: dict[int, int] = {}
        self.table: PlanTable | None = None
        self._ring: Ring | None = None
        self.take_ahead(entries)
        if not self.ahead:
            raise ValueError("an empty epoch needs no workers")
        self.max_rows = max(max_rows, *(len(b) for b in self.ahead))

    def take_ahead(self, n: int) -> None:
        it = self.batches
        while it is not None and len(self.ahead) < n:
            try:
                self.ahead.append(next(it))
            except StopIteration:
                self.batches = None
                self.exhausted = True
                return

    def _next_indices(self) -> Sequence[Any] | None:
        """The next batch's indices to plan (numbered epoch_count), past
        those in skip; None once the epoch's sampler has run out."""
        while True:
            if not self.ahead:
                self.take_ahead(1)
                if not self.ahead:
                    return None
            indices = self.ahead.popleft()
            if self.epoch_count not in self.skip:
                return indices
            self.epoch_count += 1
            self.skipped += 1

    def next_plan(self) -> Plan | None:
        """The epoch's next batch, planned as a task, before the ring
        exists (None: the epoch is over)."""
        indices = self._next_indices()
        if indices is None:
            return None
        self.check_rows(indices)
        task = self.planned
        self.planned += 1
        self.indices[task] = indices
        if self.skip or not self.ordered:
            self.numbers[task] = self.epoch_count
        self.epoch_count += 1
        return Plan(task, self.epoch, self.epoch_count - 1, list(indices))

    def check_rows(self, indices: Sequence[Any]) -> None:
        if len(indices) > self.max_rows:
            self._fail(
                ConfigError(
                    f"the sampler's batch {self.epoch_count} of epoch "
                    f"{self.epoch} has {len(indices)} indices, more than "
                    f"the {self.max_rows} slots were sized for (the "
                    "largest of the first batches it gave); pass "
                    f"max_batch_size={len(indices)} or more"
                )
            )

    # ---------------------------------------------------- once the ring exists

    def attach(
        self, ring: Ring, mapping: Any, layout: PlanLayout, held: list[Plan]
    ) -> None:
        """The plan table in the ring's region. Tasks before ``held`` were
        planned (and failed) through the workers' sockets; the table starts
        at the held ones (consecutive), whose batches workers made
        already."""
        self._ring = ring
        self.table = PlanTable(ring, mapping, layout)
        for plan in held:
            self.table.write(plan.task, plan.epoch, plan.batch, plan.indices)
        ring.set_planned(held[-1].task + 1)

    def fill(self, next_task: int) -> None:
        """Plans the epoch's next batches, as far as the table allows, the
        consumer's next task being ``next_task``."""
        table, ring = self.table, self._ring
        assert table is not None and ring is not None
        limit = next_task + self.entries
        if not self.ordered and self.indices:
            limit = min(self.indices) + self.entries
        task = self.planned
        while task < limit:
            indices = self._next_indices()
            if indices is None:
                break
            self.check_rows(indices)
            table.write(task, self.epoch, self.epoch_count, indices)
            self.indices[task] = indices
            if self.skip or not self.ordered:
                self.numbers[task] = self.epoch_count
            self.epoch_count += 1
            task += 1
        if task != self.planned:
            self.planned = task
            ring.set_planned(task)

    def begin(
        self,
        batches: Iterator[Sequence[Any]],
        epoch: int,
        first_batch: int,
        skip: frozenset[int] = frozenset(),
    ) -> int:
        """A new epoch from the next task to plan, which it returns."""
        start = self.planned
        self.indices.clear()
        self.numbers.clear()
        self.ahead.clear()
        self.skip = skip
        self.skipped = 0
        self.batches = batches
        self.exhausted = False
        self.epoch = epoch
        self.epoch_start = start
        self.epoch_first = first_batch
        self.epoch_count = first_batch
        return start
