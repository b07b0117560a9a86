"""A worker's loop, one class per kind of source, picked once when the
worker starts (as PyTorch's worker loop picks one fetcher per dataset
kind; fastq/_workers/_worker.py picks): each claims a slot, makes its batch
there and publishes it. What every loop shares, and the map-style loops;
stream sources' loops are in fastq/_workers/_stream_loops.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from .._core import _report
from .._core._plan import Plan, PlanTable
from .._core._report import UNKNOWN_SAMPLE
from .._core._ring import OWNER_WORKER, SLOT_BATCH, SLOT_ERROR, Ring
from .._layout._packing import Arena, Codec, pack
from .._make._map_fill import FirstBatch, MapFill
from .._make._worker_info import WorkerInfo
from ..errors import RingError, SpecError
from ._worker_setup import NOTHING, KeptError, seed_batch

if TYPE_CHECKING:
    from ._config import WorkerConfig

# What a worker made before the ring existed (fastq._workers._worker_setup.await_ring):
# its iterator (None: none yet) and its item (or NOTHING); None: it made none.
First = tuple[Iterator[Any] | None, Any] | None


class Producer:
    """What every kind's loop shares: claiming a slot, reporting an error
    in place of its batch, and a failure outside any batch (worker_init).
    ``run`` is the kind's loop; it returns once the ring is closed."""

    # A map-style worker's first task was claimed for it before the ring
    # existed (cfg.first_plan); a stream's worker claims its own.
    keeps_first_plan: ClassVar[bool] = True

    def __init__(self, ring: Ring, cfg: WorkerConfig, info: WorkerInfo) -> None:
        assert cfg.spec is not None
        self.ring = ring
        self.cfg = cfg
        self.info = info
        self.spec = cfg.spec
        self.wid = cfg.worker_id

    def run(self, first: First) -> None:
        raise NotImplementedError

    def _take_slot(self) -> tuple[int, int, int]:
        """(slot, task, wait_ns), or slot < 0 once the ring is closed. The
        slot's census records this worker, then the task it claims."""
        t0 = time.perf_counter_ns()
        slot = self.ring.pop_free(self.wid)
        if slot < 0:
            return slot, -1, 0
        task = self.ring.claim_task(slot)
        return slot, task, time.perf_counter_ns() - t0

    def _report(
        self, slot: int, exc: BaseException, sample: int, pass_: int = 0
    ) -> None:
        """Publishes exc in place of the slot's batch; sample is the row
        whose making failed, or UNKNOWN_SAMPLE for a whole-batch call."""
        payload = _report.encode(exc, self.ring.slot_bytes)
        memoryview(self.ring.slot_view(slot))[: len(payload)] = payload
        who = self._item_of()
        self.ring.publish(slot, SLOT_ERROR, 0, pass_, who, sample, len(payload))

    def _item_of(self) -> int:
        """Whose item a published slot is (a stream's: its lane's)."""
        return self.wid

    def report_and_stop(self, exc: BaseException) -> None:
        """Reports a failure outside any batch (worker_init) in place of one
        batch (the task claimed for it before the ring, if any), then idles
        until the consumer closes the ring."""
        kept = self.cfg.first_plan
        if kept is not None and self.keeps_first_plan:
            slot = self._kept_slot(kept.task)
        else:
            slot, _, _ = self._take_slot()
        if slot < 0:
            return
        self._report(slot, exc, UNKNOWN_SAMPLE, self.ring.pass_)  # at no sample
        self._idle_until_closed()

    def _idle_until_closed(self) -> None:
        while not self.ring.closed:
            self.ring.wait_control(self.ring.control, 1.0)

    def _kept_slot(self, task: int) -> int:
        """The slot the consumer claimed `task` with for this worker, which
        made its batch before the ring existed (NOTE [ The kept first
        batch ] in fastq/_faces/_first_batch.py): the census records it."""
        for slot, (kind, who, t) in enumerate(self.ring.census()):
            if kind == OWNER_WORKER and who == self.wid and t == task:
                return slot
        raise RingError(
            f"no slot holds batch {task} for worker {self.wid}, which made it "
            "before the ring existed"
        )


def spec_layout(spec: Any) -> str:
    return ", ".join(f"{f.name}: {f.describe()}" for f in spec.fields)


def slot_arrays(ring: Ring) -> list[np.ndarray[Any, Any]]:
    """Every slot's bytes, for packed batches and kept first batches."""
    return [
        np.frombuffer(memoryview(ring.slot_view(s)), dtype=np.uint8)
        for s in range(ring.nslots)
    ]


def field_views(ring: Ring, spec: Any) -> list[list[Any]]:
    """Full-capacity arrays over every slot, built once: writes go straight
    into shared memory with no per-batch setup."""
    return [
        spec.views(ring.slot_view(s), spec.rows, capacity=True)
        for s in range(ring.nslots)
    ]


# ------------------------------------------------------------- map-style


class MapBatches(Producer):
    """A map-style source's tasks, each batch made row by row (or by its
    fill_batch) into the slot's field arrays."""

    def __init__(self, ring: Ring, cfg: WorkerConfig, info: WorkerInfo) -> None:
        super().__init__(ring, cfg, info)
        self.slots = slot_arrays(ring)
        self.views = field_views(ring, self.spec)
        # What fill_batch gets for a full batch, built once per slot too.
        self.fill_outs = [self.spec.unflatten(v) for v in self.views]

    def run(self, first: First) -> None:
        """`first`: the FirstBatch this worker made before the ring existed
        (or NOTHING), delivered first."""
        sampler = self.cfg.sampler
        assert sampler is not None
        maker = MapFill(
            self.cfg.source,
            sampler,
            self.spec,
            self.info,
            self.cfg.seed,
            reseed=not self.cfg.in_thread,
        )
        ring = self.ring
        kept = None if first is None else first[1]
        if isinstance(kept, FirstBatch) and not self._deliver(kept):
            return
        while True:
            if self.wid >= ring.active and not self._wait_while_parked():
                return
            slot, task, wait_ns = self._take_slot()
            if slot < 0:
                return
            t0 = time.perf_counter_ns()
            try:
                n = maker.fill(task, self.views[slot], self.fill_outs[slot])
            except Exception as exc:
                row = maker.failed_row
                self._report(slot, exc, UNKNOWN_SAMPLE if row < 0 else row)
                continue
            # Counted before publishing, so stats never lag what was consumed.
            self.ring.batch_done(self.wid, time.perf_counter_ns() - t0, wait_ns)
            if not self.ring.publish(slot, SLOT_BATCH, n, 0, self.wid):
                return

    def _deliver(self, kept: FirstBatch) -> bool:
        """Publishes the batch made before the ring existed; False if the
        ring closed."""
        ring = self.ring
        slot = self._kept_slot(kept.task)
        error = kept.error
        if error is None and not (kept.spec and kept.spec.same_layout(self.spec)):
            # The ring is laid out by another worker's first sample.
            error = SpecError(
                f"batch {kept.task}'s first sample gave the layout "
                f"{spec_layout(kept.spec)}, but the batches' layout (from the "
                f"first sample any worker made) is {spec_layout(self.spec)}; "
                "samples must agree in shape and dtype (pass spec= for "
                "the largest, with jagged fields where they vary)"
            )
        if error is not None:
            row = kept.row if kept.error is not None else 0
            self._report(slot, error, UNKNOWN_SAMPLE if row < 0 else row)
            return True
        assert kept.data is not None
        t0 = time.perf_counter_ns()
        self.slots[slot][: kept.data.nbytes] = kept.data
        ring.batch_done(self.wid, kept.busy_ns + time.perf_counter_ns() - t0, 0)
        return bool(ring.publish(slot, SLOT_BATCH, kept.rows, 0, self.wid))

    def _wait_while_parked(self) -> bool:
        """Sleeps while workers="auto" keeps this worker parked (it holds
        no slot and no task meanwhile); False once the ring is closed."""
        ring = self.ring
        while not ring.closed:
            seen = ring.control  # before `active`: a change wakes the wait
            if self.wid < ring.active:
                return True
            ring.wait_control(seen, 1.0)
        return False


class PlannedBatches(Producer):
    """Tasks whose indices the consumer planned (it runs the sampler), each
    batch made by the source and packed into the slot."""

    def __init__(
        self, ring: Ring, cfg: WorkerConfig, info: WorkerInfo, plans: PlanTable
    ) -> None:
        super().__init__(ring, cfg, info)
        self.plans = plans
        self.slots = slot_arrays(ring)

    def run(self, first: First) -> None:
        """`first`: the batch this worker made before the ring existed, if
        any (task ``cfg.first_plan``), delivered first."""
        source = self.cfg.source
        codec: Codec = source.codec
        slots = self.slots
        plans = self.plans
        keep = NOTHING if first is None else first[1]
        while True:
            plan: Plan | None
            if keep is not NOTHING:
                plan = self.cfg.first_plan
                assert plan is not None
                task, wait_ns = plan.task, 0
                slot = self._kept_slot(task)
            else:
                slot, task, wait_ns = self._take_slot()
                if slot < 0:
                    return
                plan = plans.read(task)
            if plan is None:
                if self.ring.closed:
                    return
                # An abandoned epoch's task whose plan was reused: publish
                # it empty, the consumer drops it.
                if not self.ring.publish(slot, SLOT_BATCH, 0, 0, self.wid):
                    return
                continue
            t0 = time.perf_counter_ns()
            source.position = -1
            if isinstance(keep, KeptError):  # its first batch failed
                failed, keep = keep, NOTHING
                pos = failed.position
                self._report(slot, failed.error, UNKNOWN_SAMPLE if pos < 0 else pos)
                continue
            try:
                arena = source.arena = Arena(slots[slot])
                if keep is not NOTHING:
                    batch, keep = keep, NOTHING
                else:
                    self.info._start_task(plan.epoch, plan.task)
                    seed_batch(self.cfg, plan)
                    batch = source.make(plan.indices)
                used, record = pack(batch, slots[slot], codec, arena)
                del batch
            except Exception as exc:
                pos = source.position
                self._report(slot, exc, UNKNOWN_SAMPLE if pos < 0 else pos)
                continue
            finally:
                source.arena = None
            self.ring.batch_done(self.wid, time.perf_counter_ns() - t0, wait_ns)
            if not self.ring.publish(slot, SLOT_BATCH, used, 0, self.wid, 0, record):
                return


# ---------------------------------------------------------------- streams
