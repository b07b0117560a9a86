"""How a worker makes a map-style task's batch in a slot's field arrays:
its indices, the worker info and seeds of its batch, then its rows."""

from __future__ import annotations

from typing import Any

from ._rows import RowWriter
from ._sampler import EpochSampler
from ._seeding import seed_python_and_numpy
from ._spec import BatchSpec
from ._worker_info import WorkerInfo
from .errors import SpecError


class MapFill:
    """A map-style dataset's batches, made into arrays over a slot (or any
    buffer laid out by the spec): what a worker does per task, and all it
    does, between claiming the task and publishing the slot."""

    def __init__(
        self,
        dataset: Any,
        sampler: EpochSampler,
        spec: BatchSpec,
        info: WorkerInfo,
        seed: int,
        reseed: bool,
    ) -> None:
        self.dataset = dataset
        self.sampler = sampler
        self.spec = spec
        self.info = info
        self.seed = seed
        # Thread workers share the training loop's global generators.
        self.reseed = reseed
        self.fill_batch = getattr(dataset, "fill_batch", None)
        self.getitems = getattr(dataset, "__getitems__", None)
        # Copies samples into rows; its `row` names the sample being made.
        self.rows = RowWriter(spec)

    def fill(self, task: int, views: list[Any], full: Any) -> int:
        """Task's batch into `views` (capacity arrays over a slot; `full`:
        what fill_batch gets for a whole batch there): the rows made."""
        self.rows.row = -1  # until a sample's row is being made
        epoch, _ = self.sampler.locate(task)
        indices = self.sampler.batch_indices(task)
        self.info._start_task(epoch, task)
        if self.reseed:
            seed_python_and_numpy(self.seed, epoch, task)
        n = len(indices)
        if self.fill_batch is not None:
            spec = self.spec
            if n == spec.rows:
                out = full
            else:  # an epoch's short last batch
                out = spec.unflatten(spec.first_rows(views, n))
            self.fill_batch(indices, out)
            if spec.jagged:
                spec.check_filled(spec.first_rows(views, n))
        elif self.getitems is not None:
            samples = self.getitems(indices.tolist())
            if len(samples) != n:
                raise SpecError(
                    f"__getitems__ returned {len(samples)} samples for "
                    f"{n} indices; return one sample per index"
                )
            self.rows.write_samples(samples.__getitem__, list(range(n)), views)
        else:
            self.rows.write_indices(self.dataset.__getitem__, indices, views)
        return n
