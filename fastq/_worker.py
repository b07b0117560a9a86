"""Worker process entry point (spawn-safe): set up (fastq/_worker_setup.py),
attach to the ring, then produce batches straight into slots until closed."""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from . import _report
from ._handoff import handoff_for_workers
from ._jagged import JaggedArray
from ._map_fill import FirstBatch, MapFill
from ._packing import Arena, Codec, pack
from ._plan import Plan, PlanLayout, PlanTable
from ._report import UNKNOWN_SAMPLE
from ._ring import OWNER_WORKER, SLOT_BATCH, SLOT_END, SLOT_ERROR, Ring
from ._rows import RowWriter, copy_rows
from ._sampler import EpochSampler
from ._shared_arrays import Handoff, load_for_worker
from ._shm import Region, SharedFd
from ._spec import BatchSpec
from ._streams import ShuffleBuffer
from ._turns import take_turn
from ._worker_info import WorkerInfo
from ._worker_setup import NOTHING, await_ring, open_stream, seed_batch, set_up
from .errors import RingError

# WorkerConfig fields that hold user objects.
_USER_FIELDS = ("source", "worker_init")
# Starts what a worker that cannot start writes into its stack file.
STARTUP_NOTE = b"fastq: cannot start\n"


@dataclass
class WorkerConfig:
    """Everything a worker needs; pickled once per worker under spawn."""

    worker_id: int
    num_workers: int
    source: Any
    is_map: bool
    spec: BatchSpec | None  # None: worker 0 infers it, the consumer sends it
    sampler: EpochSampler | None
    seed: int
    rank: int
    world_size: int
    worker_init: Callable[[int], Any] | None
    region: SharedFd | None  # None: sent over `channel` once the spec is known
    region_size: int
    consumer_pid: int
    threads: int | None
    death_signal: bool  # the consumer's main thread started us: PDEATHSIG is exact
    stack_file: SharedFd | None = None  # where SIGUSR1 dumps the Python stack
    channel: Any = None  # without a region: a Connection to the consumer
    # Planned sources (the consumer runs the sampler): where the plans lie
    # (sent with the region), and the most indices a plan holds (to size
    # slots from batch 0). Planned and map-style sources without a spec:
    # the task whose batch worker 0 makes first, to infer the spec from.
    plan: PlanLayout | None = None
    first_plan: Plan | None = None
    max_rows: int = 0
    # Packed slots (fastq._packing): the source is a PackedSource.
    packed: bool = False
    # A stream source (fastq._streams): with stream_rows, its items are
    # samples, that many to a batch (0: whole batches); each worker's short
    # last batch dropped with drop_last; mixed through a shuffle buffer of
    # that many samples (0: none).
    stream_rows: int = 0
    drop_last: bool = False
    shuffle_buffer: int = 0
    # A stream source resumed from a state: the items of this worker's
    # stream delivered before it, which its first pass passes over, and
    # the pass number the ring's first pass stands for.
    resume_items: int = 0
    first_pass: int = 0
    # A packed stream delivered in order: the workers' items come in turn
    # (fastq/_turns.py), this worker's from `first_turn` in the ring's
    # first pass (its first batches that failed before the ring existed
    # used the turns before it).
    turns: bool = False
    first_turn: int = 0
    # A thread of the consumer's process (fastq/_thread_workers.py): the
    # process, its signals, thread pools and global random state are the
    # training loop's, and stay as they are.
    in_thread: bool = False
    # The source and worker_init as pickled for spawn and forkserver workers,
    # shared by the configs of a pool (fastq._shared_arrays.Handoff).
    handoff: Handoff | None = None

    # The user's objects travel pickled apart, inside this config's pickle
    # (spawn, forkserver): a worker that cannot rebuild them leaves the
    # reason where the consumer reads it, instead of dying with it on
    # stderr only.
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        # In one pickle, so objects they share stay shared (a worker_init
        # that is a method of the dataset runs on the worker's dataset);
        # made once for all the pool's workers, with large arrays in shared
        # memory. Descriptors inside them still reach the worker (_handoff).
        user = tuple(state.pop(n) for n in _USER_FIELDS)
        handoff = state.pop("handoff") or handoff_for_workers(user)
        state["_user"] = handoff.payload()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        data, fds, descriptors = state.pop("_user")
        state["handoff"] = None
        self.__dict__.update(state)
        try:
            values = load_for_worker(data, fds, descriptors)
        except Exception as exc:
            _leave_startup_note(self.stack_file, "source", exc)
            raise
        for name, value in zip(_USER_FIELDS, values):
            setattr(self, name, value)


def _leave_startup_note(
    stack_file: SharedFd | None, name: str, exc: BaseException
) -> None:
    """Tells the consumer, through the worker's stack file, that it could
    not rebuild the user object in field `name`, and why."""
    if stack_file is None:
        return
    try:
        text = f"{type(exc).__name__}: {exc}"
    except Exception:  # a __str__ that fails too
        text = type(exc).__name__
    what = "the source" if name == "source" else name
    note = (
        f"it could not unpickle {what} ({text}). Spawn and forkserver workers "
        "rebuild it in a fresh interpreter: every module it uses must be "
        "importable there (on sys.path, not only added to the consumer's), and "
        "its __setstate__ must work there; or let workers fork: leave "
        "start_method unset (or pass start_method='fork')"
    )
    with contextlib.suppress(OSError):
        os.pwrite(stack_file.fd, STARTUP_NOTE + note.encode(errors="replace"), 0)


def worker_main(cfg: WorkerConfig) -> None:
    """Runs in the worker process (or thread); returns when the ring
    closes."""
    info, init_error = set_up(cfg)
    first: tuple[Iterator[Any] | None, Any] | None = None
    if cfg.region is None:
        first = await_ring(cfg, info, init_error)
        if first is None:
            return
    assert cfg.region is not None
    region = Region.attach(cfg.region, cfg.region_size)
    ring = Ring.attach(region.mapping)
    ring.set_worker_pid(cfg.worker_id, os.getpid())
    producer = _Producer(ring, cfg, info)
    if init_error is not None:
        producer.report_and_stop(init_error)
        return
    if cfg.plan is not None:
        producer.run_planned(PlanTable(ring, region.mapping, cfg.plan), first)
    elif cfg.is_map:
        producer.run_map(None if first is None else first[1])
    else:
        producer.run_callable(first)


def _stream_position(it: Iterator[Any] | None, drawn: int, row: int) -> int:
    """The failing sample's place in its worker's stream, as the slot
    header's 32-bit sample field holds it: past the `drawn` samples before
    this batch, or where a shuffle buffer took it from the stream."""
    if row < 0:
        return UNKNOWN_SAMPLE
    place = it.position if isinstance(it, ShuffleBuffer) else drawn + row
    return min(place, UNKNOWN_SAMPLE - 1) if place >= 0 else UNKNOWN_SAMPLE


class _Producer:
    """The worker's loop: slot, task, produce, publish."""

    def __init__(self, ring: Ring, cfg: WorkerConfig, info: WorkerInfo) -> None:
        assert cfg.spec is not None
        self.ring = ring
        self.cfg = cfg
        self.info = info
        self.spec = cfg.spec
        self.wid = cfg.worker_id
        # Every slot's bytes, for packed batches.
        self.slots = [
            np.frombuffer(memoryview(ring.slot_view(s)), dtype=np.uint8)
            for s in range(ring.nslots)
        ]
        if cfg.packed:
            return
        # Full-capacity arrays over every slot, built once: writes go
        # straight into shared memory with no per-batch setup.
        self.views = [
            self.spec.views(ring.slot_view(s), self.spec.rows, capacity=True)
            for s in range(ring.nslots)
        ]
        # What fill_batch gets for a full batch, built once per slot too.
        self.fill_outs = [self.spec.unflatten(v) for v in self.views]
        # Copies samples into rows; its `row` names the sample being made.
        self.rows = RowWriter(self.spec)

    # ---------------------------------------------------------------- slots

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
        self.ring.publish(slot, SLOT_ERROR, 0, pass_, self.wid, sample, len(payload))

    def report_and_stop(self, exc: BaseException) -> None:
        """Reports a failure outside any batch (worker_init), then idles
        until the consumer closes the ring. A callable source's worker
        reports it again in each new pass: a pass that a `break` abandoned
        before the report must not leave the next one waiting for this
        worker's end of stream."""
        if self.cfg.turns:
            self._report_in_turns(exc)
            self._idle_until_closed()
            return
        while True:
            slot, _, _ = self._take_slot()
            if slot < 0:
                return
            pass_ = self.ring.pass_
            self._report(slot, exc, UNKNOWN_SAMPLE, pass_)  # at no sample
            if self.cfg.is_map or not self._wait_for_next_pass(pass_):
                break
        self._idle_until_closed()

    def _report_in_turns(self, exc: BaseException) -> None:
        """report_and_stop for turns: in each pass, the error in this
        worker's first turn, then its end marker in the next."""
        pass_ = 0
        first = turn = self.cfg.first_turn
        while True:
            slot, current, turn, _ = self._take_turn(pass_, turn)
            if slot < 0:
                return
            if current != pass_:
                pass_, first = current, 0
            if turn == first:
                self._report(slot, exc, UNKNOWN_SAMPLE, pass_)
                turn += 1
                continue
            if not self.ring.publish(slot, SLOT_END, 0, pass_, self.wid):
                return
            if not self._wait_for_next_pass(pass_):
                return

    def _take_turn(self, pass_: int, turn: int) -> tuple[int, int, int, int]:
        """Turns: (slot, pass, turn, wait_ns), see fastq._turns.take_turn."""
        return take_turn(self.ring, self.wid, self.cfg.num_workers, pass_, turn)

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

    def _idle_until_closed(self) -> None:
        while not self.ring.closed:
            self.ring.wait_control(self.ring.control, 1.0)

    # ------------------------------------------------------------ map-style

    def run_map(self, first: Any = None) -> None:
        """A map-style source's tasks; `first`: the FirstBatch this worker
        made before the ring existed (or None or NOTHING), delivered
        first."""
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
        if isinstance(first, FirstBatch) and not self._deliver(first):
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

    def _kept_slot(self, task: int) -> int:
        """The slot the consumer claimed `task` with for this worker, which
        made its batch before the ring existed (NOTE [ The kept first
        batch ] in fastq/_first_batch.py): the census records it."""
        for slot, (kind, who, t) in enumerate(self.ring.census()):
            if kind == OWNER_WORKER and who == self.wid and t == task:
                return slot
        raise RingError(
            f"no slot holds batch {task} for worker {self.wid}, which made it "
            "before the ring existed"
        )

    def _deliver(self, kept: FirstBatch) -> bool:
        """Publishes the batch made before the ring existed; False if the
        ring closed."""
        ring = self.ring
        slot = self._kept_slot(kept.task)
        if kept.error is not None:
            row = kept.row
            self._report(slot, kept.error, UNKNOWN_SAMPLE if row < 0 else row)
            return True
        t0 = time.perf_counter_ns()
        self.slots[slot][: kept.data.nbytes] = kept.data
        ring.batch_done(self.wid, kept.busy_ns + time.perf_counter_ns() - t0, 0)
        return bool(ring.publish(slot, SLOT_BATCH, kept.rows, 0, self.wid))

    # ------------------------------------------------------------- planned

    def run_planned(
        self, plans: PlanTable, first: tuple[Iterator[Any] | None, Any] | None
    ) -> None:
        """Tasks whose indices the consumer planned (it runs the sampler);
        `first`: the batch this worker made before the ring existed, if any
        (task ``cfg.first_plan``), delivered first."""
        source = self.cfg.source
        codec: Codec = source.codec
        slots = self.slots
        keep = NOTHING if first is None else first[1]
        while True:
            t0w = time.perf_counter_ns()
            plan: Plan | None
            if keep is not NOTHING:
                plan = self.cfg.first_plan
                assert plan is not None
                task = plan.task
                slot = self._kept_slot(task)
            else:
                slot = self.ring.pop_free(self.wid)
                if slot < 0:
                    return
                task = self.ring.claim_task(slot)
                plan = plans.read(task)
            wait_ns = time.perf_counter_ns() - t0w
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

    # ------------------------------------------------------------- callable

    def run_callable(self, first: tuple[Iterator[Any] | None, Any] | None) -> None:
        """A stream source. `first`: the iterator and first item (a batch,
        or a sample of a sample stream) that inferred the spec."""
        ring = self.ring
        cfg = self.cfg
        # `first`, its open iterator and a state's items belong to the
        # ring's pass 0, whatever pass the consumer has reached by the time
        # this worker starts (a slow worker_init, a `break` meanwhile): a
        # later pass opens a fresh stream and resumes nothing.
        pass_ = 0
        it: Iterator[Any] | None = None
        held = NOTHING
        if first is not None:
            it, held = first
        resumed = 0, cfg.resume_items  # the ring pass a state's items are of
        drawn = 0  # samples taken from this pass's stream before this batch
        ended = False  # a sample stream that ended inside its last batch
        turn = cfg.first_turn  # with turns: this worker's next one
        while True:
            if cfg.turns:
                slot, current, turn, wait_ns = self._take_turn(pass_, turn)
                turn += 1  # whatever this slot carries uses the turn up
            else:
                slot, _task, wait_ns = self._take_slot()
                current = ring.pass_
            if slot < 0:
                return
            t0 = time.perf_counter_ns()
            if current != pass_ or it is None:
                # A new pass (or the first): abandon the old iterator, and
                # the item it made before the ring existed.
                if current != pass_:
                    held = NOTHING
                pass_, it, drawn, ended = current, None, 0, False
            if cfg.stream_rows:
                self.rows.row = -1  # until a sample's row is being made
            try:
                if it is None:
                    it = open_stream(cfg, pass_)
                if resumed[1] and pass_ == resumed[0]:
                    skip = drawn = resumed[1]
                    resumed = pass_, 0
                    if held is not NOTHING:
                        held, skip = NOTHING, skip - 1
                    pass_over(it, skip)
                if cfg.stream_rows:
                    rows = 0 if ended else self._write_samples(it, held, slot)
                    held, record = NOTHING, 0
                    ended = rows < cfg.stream_rows
                    if rows == 0 or (ended and cfg.drop_last):
                        raise StopIteration  # nothing (more) to deliver
                    drawn += rows
                else:
                    if held is not NOTHING:
                        batch, held = held, NOTHING
                    else:
                        batch = next(it)
                    rows, record = self._write_batch(batch, slot)
            except StopIteration:
                if not ring.publish(slot, SLOT_END, 0, pass_, self.wid):
                    return
                if not self._wait_for_next_pass(pass_):
                    return
                it = None
                continue
            except Exception as exc:
                at = 0
                if cfg.stream_rows:
                    at = _stream_position(it, drawn, self.rows.row)
                self._report(slot, exc, at, pass_)
                if cfg.packed:
                    # A DataLoader's meaning: the error ends this batch, and
                    # the worker's iterator goes on (or ends) after it.
                    continue
                # The error ends this worker's pass. A loop that stopped
                # before reaching it (a `break`) starts another pass: join
                # it with a fresh iterator, as after an end of stream.
                if not self._wait_for_next_pass(pass_):
                    return
                it = None
                continue
            ring.batch_done(self.wid, time.perf_counter_ns() - t0, wait_ns)
            if not ring.publish(slot, SLOT_BATCH, rows, pass_, self.wid, 0, record):
                return

    def _write_samples(self, it: Iterator[Any], held: Any, slot: int) -> int:
        """A sample stream's next batch, each sample straight into its row
        of the slot (`held` first, the sample that inferred the spec): the
        rows written, fewer than a batch once the stream ends."""
        views = self.views[slot]
        first = 0
        if held is not NOTHING:
            self.rows.write_samples(lambda _: held, [0], views)
            first = 1
        return self.rows.write_stream(it, first, self.spec.rows, views)

    def _wait_for_next_pass(self, pass_: int) -> bool:
        """Sleeps until the consumer starts another pass; False if closed."""
        ring = self.ring
        while True:
            seen = ring.control
            if ring.closed:
                return False
            if ring.pass_ != pass_:
                return True
            ring.wait_control(seen, 1.0)

    def _write_batch(self, batch: Any, slot: int) -> tuple[int, int]:
        """Writes a whole batch into slot: (rows, or a packed batch's arena
        bytes; a packed batch's record bytes)."""
        if self.cfg.packed:
            # Not made into the slot (the iterator ran before it was known).
            return pack(batch, self.slots[slot], self.cfg.source.codec)
        rows, arrays = self.spec.batch_arrays(batch)
        for i, (view, arr) in enumerate(zip(self.views[slot], arrays)):
            if isinstance(arr, JaggedArray):
                self.spec.put_jagged_batch(i, arr, view)
            else:
                copy_rows(view, arr, rows)
        return rows, 0


def pass_over(it: Iterator[Any], n: int) -> None:
    """Moves a resumed stream past the n items delivered before its state:
    with the iterator's own ``skip(n)`` where it has one (a reader that can
    seek), else by making them again, unseen."""
    skip = getattr(it, "skip", None)
    if callable(skip):
        skip(n)
        return
    for _ in itertools.islice(it, n):
        pass
