"""A worker's start, before its loop: the process's set-up (signals, death
watch, thread pools, seeds, worker info, worker_init) and, without a ring
yet, its first items until the consumer hands the ring over."""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .._core._memfd import SharedFd
from .._core._plan import Plan
from .._layout._packing import PackedSpec, measure
from .._layout._spec import BatchSpec
from .._make._map_fill import FirstBatch, MapFill
from .._make._seeding import mix_seed, seed_python_and_numpy
from .._make._streams import worker_stream
from .._make._worker_info import WorkerInfo, _answer_for_torch, _set_worker_info
from ._handshake import WorkerEnd
from ._threads import limit_threads

if TYPE_CHECKING:
    from ._config import WorkerConfig

_PR_SET_PDEATHSIG = 1
# torch's seeds as DataLoader's are: below 2**63, so torch.initial_seed()
# fits the int64 a dataset may put in a tensor.
TORCH_SEED_MASK = (1 << 63) - 1
# No item: none was made, or it was delivered.
NOTHING: Any = object()


def set_up(cfg: WorkerConfig) -> tuple[WorkerInfo, Exception | None]:
    """Everything a worker does before it makes anything. A thread worker
    leaves the process (signals, thread pools, global random state) as
    the training loop has it. Returns the worker's info and what
    worker_init raised, if it did (reported in place of every batch)."""
    if not cfg.in_thread:
        _isolate_from_terminal(cfg.stack_file)
        _die_with_consumer(cfg.consumer_pid, cfg.death_signal)
        if cfg.threads is not None:
            limit_threads(cfg.threads)
    # A stream's iterators see its lanes (NOTE [ A stream's lanes ] in
    # fastq/_workers/_lanes.py); this process's first lane is its own id.
    rank, ident, workers, world = cfg.lane_view(cfg.worker_id)
    info = WorkerInfo(ident, workers, cfg.seed, rank, world, cfg.source)
    _set_worker_info(info, cfg.in_thread)
    if not cfg.in_thread:
        seed_globals(cfg.seed, ident, cfg.first_pass)
        if not cfg.packed:  # fastq.torch.DataLoader's workers do it their way
            _answer_for_torch(info)
    if cfg.packed:
        cfg.source.start_worker(info)
    init_error: Exception | None = None
    try:
        if cfg.worker_init is not None:
            cfg.worker_init(cfg.worker_id)
    except Exception as exc:
        init_error = exc
    return info, init_error


# ------------------------------------------------ before the ring exists


def await_ring(
    cfg: WorkerConfig, info: WorkerInfo, init_error: Exception | None
) -> tuple[Iterator[Any] | None, Any] | None:
    """Before the ring exists (a source without a spec): slots are sized
    from a first item, made here, in a worker, never in the consumer (NOTE
    [ The hand-shake before the ring ] in fastq/_workers/_handshake.py). Once the
    ring arrives, ``cfg`` holds it, and this returns what the worker starts
    with: its iterator (None: none yet) and the item it made (or NOTHING);
    None if the consumer closed."""
    end = WorkerEnd(cfg.channel)
    first = _FirstItems(cfg, info, end)
    given = end.await_ring(cfg.first_plan, cfg.worker_id == 0, init_error, first)
    if given is None:
        return None
    ready, fd, plan = given
    cfg.region, cfg.region_size = SharedFd(fd), ready.size
    cfg.spec, cfg.plan = ready.spec, ready.layout
    if plan is not None and plan.task not in ready.kept:
        # The consumer raised this task's error itself, before the ring.
        plan, first.item = None, NOTHING
    cfg.first_plan = plan  # the task whose batch (or error) is kept, if any
    return first.it, first.item


class _FirstItems:
    """A worker's attempts at a first item, each answered through its end
    of the channel: the planned task's batch (a map-style source's: a
    FirstBatch), or the iterable's next item. Keeps the iterable's
    iterator and the last item made (NOTHING if it failed or was none)."""

    def __init__(self, cfg: WorkerConfig, info: WorkerInfo, end: WorkerEnd) -> None:
        self.cfg = cfg
        self.info = info
        self.end = end
        self.it: Iterator[Any] | None = None
        self.item: Any = NOTHING

    def __call__(self, plan: Plan | None, fresh: bool) -> None:
        cfg = self.cfg
        if fresh:
            self.it = None
        self.item = NOTHING
        if plan is not None and not cfg.packed:
            self.item = self._map_batch(plan)
            return
        if plan is not None:
            self.info._start_task(plan.epoch, plan.task)
        try:
            if plan is not None:
                seed_batch(cfg, plan)
                item = cfg.source.make(plan.indices)
                scale = cfg.max_rows / max(1, len(plan.indices))
            else:
                if cfg.worker_id >= (cfg.streams or cfg.num_workers):
                    raise StopIteration  # a process with no lane
                if self.it is None:
                    source = resumed_first_source(cfg)
                    self.it = open_stream(cfg, 0, cfg.worker_id, source)
                item = next(self.it)  # a sample, in a sample stream
                scale = 1.0
            if cfg.packed:
                spec: Any = PackedSpec.sized(*measure(item, cfg.source.codec), scale)
            elif cfg.stream_rows:
                spec = BatchSpec.from_sample(item, cfg.stream_rows)
            else:
                spec = BatchSpec.from_batch(item)
        except StopIteration:
            self.end.empty()
            return
        except Exception as exc:
            position = getattr(cfg.source, "position", -1) if plan is not None else -1
            self.end.failed(exc, position)
            if plan is None:
                cfg.first_turn += 1  # raised in its turn before the ring
            else:  # reported in its slot, if another worker's spec sizes the ring
                self.item = KeptError(exc, position)
            return
        self.end.found(spec)
        self.item = item

    def _map_batch(self, plan: Plan) -> Any:
        """A map-style source's first batch: the spec, from its first
        sample, goes to the consumer at once (it builds the ring while the
        rest is made); the batch, or the error that ended it after that,
        waits for its slot. Returns the FirstBatch, or NOTHING if the spec
        could not be had: the error, kept with the task."""
        cfg = self.cfg
        assert cfg.sampler is not None
        maker = MapFill(
            cfg.source, cfg.sampler, None, self.info, cfg.seed, not cfg.in_thread
        )
        try:
            spec = maker.begin_first(plan.task)
        except Exception as exc:
            # Reported in its slot if another worker's spec sizes the ring.
            row = maker.failed_row
            self.end.failed(exc, row)
            return FirstBatch(plan.task, None, 0, 0, exc, row, None)
        self.end.found(spec)
        return maker.end_first()


class KeptError:
    """A planned task's first batch that failed before the ring existed:
    reported in the task's slot if the ring comes from another's spec."""

    __slots__ = ("error", "position")

    def __init__(self, error: Exception, position: int) -> None:
        self.error = error
        self.position = position


# ---------------------------------- shared by the first items and the loops


def open_stream(
    cfg: WorkerConfig, ring_pass: int, lane: int, source: Any = None
) -> Iterator[Any]:
    """Lane ``lane``'s iterator over ``source`` (None: the worker's) in the
    ring's pass ``ring_pass``."""
    rank, ident, _, _ = cfg.lane_view(lane)
    return worker_stream(
        cfg.source if source is None else source,
        shuffle_buffer=cfg.shuffle_buffer,
        seed=cfg.seed,
        pass_=cfg.first_pass + ring_pass,
        rank=rank,
        worker_id=ident,
    )


def keeps_place(source: Any) -> bool:
    """A source whose dataset keeps its own place (torchdata's Stateful:
    ``state_dict()`` and ``load_state_dict()``; fastq.torch's
    IterableSource says so): each lane iterates a copy of its own, and a
    resumed one loads its saved state instead of passing over items."""
    return bool(getattr(source, "stateful", False))


def resumed_first_source(cfg: WorkerConfig) -> Any:
    """The source a worker's first item (made before the ring) comes
    from: the worker's own, or, for a resumed stateful one, a copy with
    its first lane's state loaded, so that no delivered item is made
    again (its lane then starts past its state: ``first_resumed``)."""
    states = cfg.resume_states
    state = None if states is None else states[cfg.worker_id]
    if state is None or not keeps_place(cfg.source) or cfg.first_resumed:
        return None
    source = cfg.source.for_lane()
    source.load_lane_state(state)
    cfg.first_resumed, cfg.first_source = True, source
    return source


def seed_batch(cfg: WorkerConfig, plan: Plan) -> None:
    """Every generator from (seed, epoch, batch): the batch's randomness does
    not depend on which worker makes it, or how many there are."""
    if not cfg.in_thread:
        seed_python_and_numpy(cfg.seed, plan.epoch, plan.batch)
    if cfg.packed:
        cfg.source.reseed(mix_seed(cfg.seed, plan.epoch, plan.batch) & TORCH_SEED_MASK)


# ------------------------------------------------------------- the process


def _isolate_from_terminal(stack_file: SharedFd | None) -> None:
    # Ctrl+C goes to the whole process group; the consumer alone handles it
    # and tears the workers down, so they must not print a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _reset_signals()
    # On a FetchTimeout the consumer asks for this worker's Python stack with
    # SIGUSR1 and reads it from this file into the error message.
    if stack_file is not None and hasattr(signal, "SIGUSR1"):
        global _stack_file
        _stack_file = os.fdopen(stack_file.fd, "w")
        faulthandler.register(signal.SIGUSR1, file=_stack_file, all_threads=True)


_stack_file: Any = None  # kept open for faulthandler's lifetime

# What a fresh interpreter ignores; every other catchable signal starts at
# its default action.
_IGNORED_AT_START = {
    getattr(signal, name) for name in ("SIGPIPE", "SIGXFSZ") if hasattr(signal, name)
}


def _reset_signals() -> None:
    """Gives the worker a fresh process's signals. Under fork it inherits
    the parent's handlers (a trainer's SIGTERM handler would keep it alive
    through every SIGTERM), its blocked mask (spawn too, across exec) and
    its wakeup fd (an event loop's, which would hear our signals). A
    handler whose Python view is already the default is left: it may be
    faulthandler's, installed beneath Python."""
    # SIGINT stays ignored throughout (see _isolate_from_terminal).
    skip = {getattr(signal, n, None) for n in ("SIGKILL", "SIGSTOP", "SIGINT")}
    for sig in signal.valid_signals():
        if sig in skip:
            continue
        target = signal.SIG_IGN if sig in _IGNORED_AT_START else signal.SIG_DFL
        try:
            if signal.getsignal(sig) != target:
                signal.signal(sig, target)
        except (OSError, ValueError):  # reserved by the C library (32, 33)
            pass
    signal.set_wakeup_fd(-1)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_SETMASK, [])


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


def seed_globals(seed: int, worker_id: int, pass_: int = 0) -> None:
    """Every global generator, torch's included, from (seed, worker id):
    once per worker, and a stream's lane's again each pass (``pass_``
    above 0), so that a pass's draws do not depend on the passes before;
    the epoch slots from 1 << 33 are ones no batch has."""
    seed_python_and_numpy(seed, (1 << 33) + pass_, worker_id)
    torch = sys.modules.get("torch")
    if torch is not None:
        word = mix_seed(seed, (1 << 33) + pass_, worker_id)
        torch.manual_seed(word & TORCH_SEED_MASK)
