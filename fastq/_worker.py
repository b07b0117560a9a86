"""Worker process entry point (spawn-safe): attach to the ring, seed, run
worker_init, then produce batches straight into slots until closed."""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing import reduction
from typing import Any, Callable

import numpy as np

from . import _report
from ._ring import SLOT_BATCH, SLOT_END, SLOT_ERROR, Ring
from ._rows import RowWriter, copy_rows
from ._sampler import EpochSampler
from ._seeding import mix_seed, seed_python_and_numpy
from ._shm import Region, SharedFd
from ._spec import BatchSpec
from ._threads import limit_threads
from ._worker_info import WorkerInfo, _set_worker_info
from .errors import SpecError

_PR_SET_PDEATHSIG = 1
# Header value for "the failure was not at one sample" (a whole-batch call).
_UNKNOWN_SAMPLE = 0xFFFFFFFF
_NOTHING = object()
# Bound of an error report sent before the ring (and its slots) exists.
_REPORT_LIMIT = 1 << 20


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


def worker_main(cfg: WorkerConfig) -> None:
    """Runs in the worker process; returns when the ring closes."""
    _isolate_from_terminal(cfg.stack_file)
    _die_with_consumer(cfg.consumer_pid, cfg.death_signal)
    if cfg.threads is not None:
        limit_threads(cfg.threads)
    info = WorkerInfo(
        cfg.worker_id,
        cfg.num_workers,
        cfg.seed,
        cfg.rank,
        cfg.world_size,
        cfg.source,
    )
    _set_worker_info(info)
    _seed_globals(cfg.seed, cfg.worker_id)
    init_error: Exception | None = None
    try:
        if cfg.worker_init is not None:
            cfg.worker_init(cfg.worker_id)
    except Exception as exc:
        init_error = exc
    first: tuple[Iterator[Any], Any] | None = None
    if cfg.region is None:
        if cfg.worker_id == 0:
            # The consumer waits for this worker's spec before anything else.
            if init_error is not None:
                cfg.channel.send(("error", _report.encode(init_error, _REPORT_LIMIT)))
                return
            first = _first_batch(cfg)
            if first is None:
                return
        if not _receive_region(cfg):
            return
    assert cfg.region is not None
    ring = Ring.attach(Region.attach(cfg.region, cfg.region_size).mapping)
    ring.set_worker_pid(cfg.worker_id, os.getpid())
    producer = _Producer(ring, cfg, info)
    if init_error is not None:
        producer.report_and_stop(init_error)
        return
    if cfg.is_map:
        producer.run_map()
    else:
        producer.run_callable(first)


def _first_batch(cfg: WorkerConfig) -> tuple[Iterator[Any], Any] | None:
    """Worker 0 of a callable source without a spec: makes its first batch
    here, in the worker (never in the consumer), and sends the consumer the
    spec inferred from it. The batch is kept and delivered first."""
    conn = cfg.channel
    try:
        it = iter(cfg.source())
        batch = next(it)
        spec = BatchSpec.from_batch(batch)
    except StopIteration:
        conn.send(("empty", None))
        return None
    except Exception as exc:
        conn.send(("error", _report.encode(exc, _REPORT_LIMIT)))
        return None
    conn.send(("spec", spec))
    return it, batch


def _receive_region(cfg: WorkerConfig) -> bool:
    """Waits for the ring the consumer makes once the spec is known; False
    if it closed instead."""
    conn = cfg.channel
    try:
        kind, (size, spec) = conn.recv()
        fd = reduction.recv_handle(conn)
    except (EOFError, OSError):
        return False
    finally:
        conn.close()
    cfg.region, cfg.region_size, cfg.spec = SharedFd(fd), size, spec
    return bool(kind == "region")


def _isolate_from_terminal(stack_file: SharedFd | None) -> None:
    # Ctrl+C goes to the whole process group; the consumer alone handles it
    # and tears the workers down, so they must not print a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # On a FetchTimeout the consumer asks for this worker's Python stack with
    # SIGUSR1 and reads it from this file into the error message.
    if stack_file is not None and hasattr(signal, "SIGUSR1"):
        global _stack_file
        _stack_file = os.fdopen(stack_file.fd, "w")
        faulthandler.register(signal.SIGUSR1, file=_stack_file, all_threads=True)


_stack_file: Any = None  # kept open for faulthandler's lifetime


def _die_with_consumer(consumer_pid: int, death_signal: bool) -> None:
    """Makes sure this worker never outlives the consumer process."""
    parent = os.getppid()
    # PR_SET_PDEATHSIG: the kernel kills us when our parent *thread* exits,
    # even while user code holds the GIL. The parent is the consumer (fork,
    # spawn: exact only if its main thread started us) or the fork server
    # (single-threaded, and it exits when the consumer does).
    if sys.platform.startswith("linux") and (parent != consumer_pid or death_signal):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    # The parent may have died before prctl took effect.
    if os.getppid() != parent or not _alive(consumer_pid):
        os._exit(1)
    # For every start method and without the kernel's help: a thread that
    # wakes the moment the consumer exits and kills this process.
    threading.Thread(
        target=_watch_consumer,
        args=(consumer_pid,),
        name="fastq-consumer-watch",
        daemon=True,
    ).start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _watch_consumer(pid: int) -> None:
    import select

    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = -1
    if fd >= 0:
        # poll, not select: select fails on descriptors above 1023, which a
        # worker holding many tensors' descriptors can reach.
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while not poller.poll():
            pass
    else:
        # No pidfd (old kernel or not Linux): poll the pid. Bounded: one
        # cheap check every 200 ms, off the data path.
        while _alive(pid):
            time.sleep(0.2)
    os.kill(os.getpid(), signal.SIGKILL)


def _seed_globals(seed: int, worker_id: int) -> None:
    """Once per worker: every global generator, torch's included, from
    (seed, worker id); the epoch slot 1 << 33 is one no batch has."""
    seed_python_and_numpy(seed, 1 << 33, worker_id)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(mix_seed(seed, 1 << 33, worker_id))


class _Producer:
    """The worker's loop: slot, task, produce, publish."""

    def __init__(self, ring: Ring, cfg: WorkerConfig, info: WorkerInfo) -> None:
        assert cfg.spec is not None
        self.ring = ring
        self.cfg = cfg
        self.info = info
        self.spec = cfg.spec
        self.wid = cfg.worker_id
        # Full-capacity arrays over every slot, built once: writes go
        # straight into shared memory with no per-batch setup.
        self.views = [
            self.spec.views(ring.slot_view(s), self.spec.rows)
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
        whose making failed, or _UNKNOWN_SAMPLE for a whole-batch call."""
        payload = _report.encode(exc, self.ring.slot_bytes)
        memoryview(self.ring.slot_view(slot))[: len(payload)] = payload
        self.ring.publish(slot, SLOT_ERROR, 0, pass_, self.wid, sample, len(payload))

    def report_and_stop(self, exc: BaseException) -> None:
        """Reports a failure outside any batch (worker_init), then idles
        until the consumer closes the ring."""
        slot, _, _ = self._take_slot()
        if slot >= 0:
            self._report(slot, exc, 0)
        self._idle_until_closed()

    def _idle_until_closed(self) -> None:
        while not self.ring.closed:
            self.ring.wait_control(self.ring.control, 1.0)

    # ------------------------------------------------------------ map-style

    def run_map(self) -> None:
        sampler = self.cfg.sampler
        assert sampler is not None
        dataset = self.cfg.source
        fill = getattr(dataset, "fill_batch", None)
        getitems = getattr(dataset, "__getitems__", None)
        while True:
            slot, task, wait_ns = self._take_slot()
            if slot < 0:
                return
            t0 = time.perf_counter_ns()
            self.rows.row = -1  # until write_samples starts on a sample
            try:
                epoch, _ = sampler.locate(task)
                indices = sampler.batch_indices(task)
                self.info._start_task(epoch, task)
                seed_python_and_numpy(self.cfg.seed, epoch, task)
                views = self.views[slot]
                if fill is not None:
                    n = len(indices)
                    if n == self.spec.rows:
                        out = self.fill_outs[slot]
                    else:  # an epoch's short last batch
                        out = self.spec.unflatten([v[:n] for v in views])
                    fill(indices, out)
                elif getitems is not None:
                    samples = getitems(indices.tolist())
                    if len(samples) != len(indices):
                        raise SpecError(
                            f"__getitems__ returned {len(samples)} samples for "
                            f"{len(indices)} indices; return one sample per index"
                        )
                    self.rows.write_samples(
                        samples.__getitem__, list(range(len(samples))), views
                    )
                else:
                    get = dataset.__getitem__
                    self.rows.write_samples(get, indices.tolist(), views)
            except Exception as exc:
                row = self.rows.row
                self._report(slot, exc, _UNKNOWN_SAMPLE if row < 0 else row)
                continue
            # Counted before publishing, so stats never lag what was consumed.
            self.ring.batch_done(self.wid, time.perf_counter_ns() - t0, wait_ns)
            if not self.ring.publish(slot, SLOT_BATCH, len(indices), 0, self.wid):
                return

    # ------------------------------------------------------------- callable

    def run_callable(self, first: tuple[Iterator[Any], Any] | None) -> None:
        """`first`: the iterator and first batch that inferred the spec."""
        ring = self.ring
        pass_ = ring.pass_
        it: Iterator[Any] | None = None
        held = _NOTHING
        if first is not None:
            it, held = first
        while True:
            slot, _task, wait_ns = self._take_slot()
            if slot < 0:
                return
            t0 = time.perf_counter_ns()
            current = ring.pass_
            if current != pass_ or it is None:
                # A new pass (or the first): abandon the old iterator.
                pass_, it = current, None
            try:
                if it is None:
                    it = iter(self.cfg.source())
                if held is not _NOTHING:
                    batch, held = held, _NOTHING
                else:
                    batch = next(it)
                rows = self._write_batch(batch, self.views[slot])
            except StopIteration:
                if not ring.publish(slot, SLOT_END, 0, pass_, self.wid):
                    return
                if not self._wait_for_next_pass(pass_):
                    return
                it = None
                continue
            except Exception as exc:
                self._report(slot, exc, 0, pass_)
                self._idle_until_closed()
                return
            ring.batch_done(self.wid, time.perf_counter_ns() - t0, wait_ns)
            if not ring.publish(slot, SLOT_BATCH, rows, pass_, self.wid):
                return

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

    def _write_batch(self, batch: Any, views: list[np.ndarray[Any, Any]]) -> int:
        rows, arrays = self.spec.batch_arrays(batch)
        for view, arr in zip(views, arrays):
            copy_rows(view, arr, rows)
        return rows
