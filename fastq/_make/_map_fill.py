"""How a worker makes a map-style task's batch in a slot's field arrays:
its indices, the worker info and seeds of its batch, then its rows."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._layout._rows import RowWriter
from .._layout._spec import BatchSpec
from ..errors import SpecError
from ._sampler import EpochSampler
from ._seeding import seed_python_and_numpy
from ._worker_info import WorkerInfo


@dataclass
class FirstBatch:
    """A task's batch made before the ring existed (no ``spec=``): its
    bytes laid out as in a slot by ``spec`` (the one its own first sample
    gave), which go into the slot claimed for the task once the ring
    exists, or the error that ended it (published in that slot instead,
    naming row ``row``)."""

    task: int
    data: np.ndarray[Any, Any] | None
    rows: int
    busy_ns: int
    error: Exception | None
    row: int
    spec: BatchSpec | None


class MapFill:
    """A map-style dataset's batches, made into arrays over a slot (or any
    buffer laid out by the spec): what a worker does per task, and all it
    does, between claiming the task and publishing the slot.

    Without a spec, ``begin_first`` and ``end_first`` make the run's first
    batch and infer the spec from it; ``fill`` needs the spec."""

    def __init__(
        self,
        dataset: Any,
        sampler: EpochSampler,
        spec: BatchSpec | None,
        info: WorkerInfo,
        seed: int,
        reseed: bool,
    ) -> None:
        self.dataset = dataset
        self.sampler = sampler
        self.info = info
        self.seed = seed
        # Thread workers share the training loop's global generators.
        self.reseed = reseed
        self.fill_batch = getattr(dataset, "fill_batch", None)
        self.getitems = getattr(dataset, "__getitems__", None)
        self.row = -1  # the row being made (before the RowWriter exists)
        self._use(spec)
        # The first batch between begin_first and end_first: its task,
        # indices, spec and how end_first gets row j's sample (None: a
        # fill_batch), and when it began.
        self._first: tuple[int, Any, BatchSpec, Any] | None = None
        self._first_t0 = 0

    def _use(self, spec: BatchSpec | None) -> None:
        self.spec = spec
        # Copies samples into rows; its `row` names the sample being made.
        self.rows = None if spec is None else RowWriter(spec)

    @property
    def failed_row(self) -> int:
        """The row whose sample was being made, or -1 for none in
        particular (a whole-batch call)."""
        return self.row if self.rows is None else self.rows.row

    def _start(self, task: int) -> np.ndarray[tuple[int], np.dtype[np.int64]]:
        """Task's indices, with the worker info and the global generators
        set for its batch."""
        epoch, _ = self.sampler.locate(task)
        indices = self.sampler.batch_indices(task)
        self.info._start_task(epoch, task)
        if self.reseed:
            seed_python_and_numpy(self.seed, epoch, task)
        return indices

    def fill(self, task: int, views: list[Any], full: Any) -> int:
        """Task's batch into `views` (capacity arrays over a slot; `full`:
        what fill_batch gets for a whole batch there): the rows made."""
        spec, rows = self.spec, self.rows
        assert spec is not None and rows is not None
        rows.row = -1  # until a sample's row is being made
        indices = self._start(task)
        n = len(indices)
        if self.fill_batch is not None:
            if n == spec.rows:
                out = full
            else:  # an epoch's short last batch
                out = spec.unflatten(spec.first_rows(views, n))
            self.fill_batch(indices, out)
            if spec.jagged:
                spec.check_filled(spec.first_rows(views, n))
        elif self.getitems is not None:
            samples = self._getitems(indices)
            rows.write_samples(samples.__getitem__, list(range(n)), views)
        else:
            rows.write_indices(self.dataset.__getitem__, indices, views)
        return n

    def begin_first(self, task: int) -> BatchSpec:
        """The spec of task's batch, made without one: what the batch's
        first sample says, fetched as ``fill`` fetches it (the same calls,
        in the same order, under the same seeds). ``end_first`` makes the
        rest. A fill_batch needs arrays before any sample: its dataset's
        first sample is read with __getitem__ to lay them out (once per
        run), and ``end_first`` sets the seeds again, so its batch is the
        one a run given spec= makes."""
        self._first_t0 = time.perf_counter_ns()
        self._use(None)
        self.row = -1
        indices = self._start(task)
        getitem = self.dataset.__getitem__
        get: Any = None  # fill_batch makes the batch in one call
        if self.fill_batch is not None:
            self.row = 0
            head = getitem(int(indices[0]))
        elif self.getitems is not None:
            samples = self._getitems(indices)
            self.row = 0
            head = samples[0]
            get = samples.__getitem__
        else:
            keys = indices.tolist()
            self.row = 0
            head = getitem(keys[0])

            def get(j: int) -> Any:
                # Row 0 is the sample the spec came from: not fetched again.
                return head if j == 0 else getitem(keys[j])

        spec = BatchSpec.from_sample(head, self.sampler.batch_size)
        self._first = (task, indices, spec, get)
        return spec

    def end_first(self) -> FirstBatch:
        """The rest of the batch ``begin_first`` began, in a buffer laid
        out as a slot (no slot exists yet). An error here is kept, to be
        raised at the batch's turn as it would be with spec=."""
        assert self._first is not None
        task, indices, spec, get = self._first
        self._first = None
        n = len(indices)
        data = np.zeros(spec.slot_bytes, np.uint8)
        views = spec.views(data, spec.rows, capacity=True)
        error: Exception | None = None
        try:
            if get is None:
                assert self.fill_batch is not None
                self.row = -1
                self._start(task)
                self.fill_batch(indices, spec.unflatten(spec.first_rows(views, n)))
            else:
                self._use(spec)
                assert self.rows is not None
                self.rows.write_samples(get, list(range(n)), views)
        except Exception as exc:
            error = exc
        busy = time.perf_counter_ns() - self._first_t0
        return FirstBatch(task, data, n, busy, error, self.failed_row, spec)

    def _getitems(self, indices: np.ndarray[Any, Any]) -> Any:
        assert self.getitems is not None
        samples = self.getitems(indices.tolist())
        if len(samples) != len(indices):
            raise SpecError(
                f"__getitems__ returned {len(samples)} samples for "
                f"{len(indices)} indices; return one sample per index"
            )
        return samples
