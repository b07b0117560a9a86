"""Worker processes: start method, start, the hand-over of the ring and
bounded teardown; the death watch is fastq/_workers/_death_watch.py."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import signal
import sys
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from multiprocessing.connection import wait
from typing import Any

from .._core._plan import PlanLayout
from .._core._ring import NO_TASK, OWNER_WORKER, Ring
from .._core._shm import Region
from ..errors import (
    ConfigError,
    EmptySource,
    FetchTimeout,
    SharedMemoryError,
    WorkerDied,
)
from ._before_workers import before_workers_start
from ._config import WorkerConfig
from ._copied_objects import warn_of_copied_objects
from ._death_watch import MAIN_REIMPORTED_EXIT, DeathWatch, main_reimported
from ._handoff import handoff_for_workers
from ._handshake import (
    Answer,
    Probe,
    ProbeStream,
    RingReady,
    hand_over,
    probe,
    receive_answer,
    stream_spec,
)
from ._shared_arrays import Handoff
from ._thread_workers import METHOD as THREAD_METHOD
from ._thread_workers import ThreadWorker
from ._worker import worker_main

# How long close() lets workers leave on their own before SIGKILL: long
# enough for a worker between batches, short enough to bound close().
GRACE_SECONDS = 0.5


@contextlib.contextmanager
def _sigint_held(method: str) -> Iterator[None]:
    """A Ctrl+C while a worker starts is held, then raised once it has: the
    pool then knows the worker and reaps it. The worker ignores SIGINT from
    its set-up on (the consumer alone handles Ctrl+C). A forked child
    inherits the holding handler, harmless until then; a child that execs
    (spawn, forkserver) starts with SIGINT ignored instead, since a handler
    does not survive exec (a Ctrl+C in that moment is dropped, as before),
    so that it cannot print a traceback while it boots."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    if method == "fork":
        previous = signal.signal(signal.SIGINT, lambda sig, frame: held.append(sig))
    else:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if held:
            signal.raise_signal(signal.SIGINT)  # through the restored handler


# Pools alive in this process, for the fork and exit hooks below.
_live_pools: weakref.WeakSet[WorkerPool] = weakref.WeakSet()


def _check_can_start_workers() -> None:
    """Refuses, with the cause and the fix, where multiprocessing would
    fail to start a worker with a bare assertion or RuntimeError."""
    proc = mp.current_process()
    if getattr(proc, "_inheriting", False):
        # multiprocessing is starting this process as a worker (or a fork
        # server) and re-runs the main script to do so: the script builds
        # a Prefetcher at import time. Exiting with a known code lets the
        # consumer name the cause; raising would only print multiprocessing's
        # RuntimeError here, and the consumer would see exit code 1.
        with contextlib.suppress(Exception):
            sys.stderr.write(f"fastq: {main_reimported(None)}\n")
            sys.stderr.flush()
            sys.stdout.flush()
        os._exit(MAIN_REIMPORTED_EXIT)
    if proc.daemon:
        raise ConfigError(
            f"this process ({proc.name}, pid {os.getpid()}) is daemonic (a "
            "multiprocessing.Pool worker, a fastq or DataLoader worker, or a "
            "Process started with daemon=True), and multiprocessing does not "
            "let daemonic processes start children, so the Prefetcher cannot "
            "start its workers. Create the Prefetcher in the main process (or "
            "in a process started with daemon=False)"
        )


@contextlib.contextmanager
def _no_missing_main_file() -> Iterator[None]:
    """Hides the file of a __main__ read from standard input (`python -`
    names it "<stdin>") while a worker starts: spawn and the fork server
    would run that path as the worker's main module and fail, where an
    empty main is what such a worker needs (the source travels by value,
    fastq/_workers/_handoff.py)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not path or os.path.exists(path):
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = path


class _ExitHook:
    """Closes every live pool when the interpreter exits, before
    multiprocessing's own exit handler SIGTERMs and joins (without a
    timeout) every daemonic child: a worker that ignores or handles SIGTERM
    (a trainer's handler inherited under fork, or user code) would hang
    the exit. atexit runs handlers last-registered first, so this one is
    registered when the first pool starts, after multiprocessing.util
    registered its handler on import."""

    installed = False

    def install(self) -> None:
        if self.installed:
            return
        import atexit
        import multiprocessing.util  # noqa: F401 (its handler must come first)

        atexit.register(self)
        self.installed = True

    def __call__(self) -> None:
        for pool in list(_live_pools):
            # Bounded: GRACE_SECONDS, then SIGKILL. A pool of another
            # process (inherited through fork) is left alone by close().
            with contextlib.suppress(Exception):
                pool.close()


_close_pools_at_exit = _ExitHook()


def _forget_workers_in_forked_child() -> None:
    """A child forked from a process that runs pools (a helper the training
    script forks) inherits multiprocessing's list of that process's
    children, and at exit multiprocessing SIGTERMs and joins every daemonic
    one on it: the parent's workers. They are not this process's children,
    so they leave the list here. (The list is multiprocessing's private
    ``process._children``; without it there is nothing to forget.)"""
    children = getattr(mp.process, "_children", None)
    if children is None:
        return
    for pool in list(_live_pools):
        for p in pool.processes:
            children.discard(p)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_workers_in_forked_child)


def _close_channels(channels: list[Any]) -> None:
    for conn in channels:
        conn.close()  # idempotent: a closed Connection forgets its descriptor


class WorkerPool:
    """Starts the workers, hands them the ring and tears them down, in
    bounded time; its DeathWatch (fastq/_workers/_death_watch.py) watches them once
    they have the ring, and a death alerts the consumer.

    With a ring, workers attach to it at once. Without one (a source whose
    spec is not given), every worker given a task makes its first batch,
    and the first spec found (``receive_any``; an iterable's: ``receive_spec``)
    sizes it; the consumer then makes the ring
    and sends every worker its descriptor (``send_region``): NOTE [ The
    hand-shake before the ring ] in fastq/_workers/_handshake.py.
    """

    def __init__(
        self, ctx: Any, configs: list[WorkerConfig], ring: Ring | None
    ) -> None:
        self._method = ctx.get_start_method()
        threads = self._method == THREAD_METHOD
        if not threads:
            _check_can_start_workers()
        _close_pools_at_exit.install()
        self._ring = ring
        self._pid = os.getpid()
        # What ends the run at the loop's next batch: the first worker's
        # death, or the ring's memory that could not be reserved (`fail`).
        self.failure: WorkerDied | SharedMemoryError | None = None
        self._closing = False
        self.processes: list[Any] = []
        self._channels: list[Any] = []
        # The channels stay reachable from here, so that the garbage
        # collector never finalizes one (closing its descriptor, which it
        # then still names) before this pool's owner closes it: a pool
        # dropped in a reference cycle (an exception's traceback) would
        # otherwise close a descriptor twice, maybe someone else's.
        weakref.finalize(self, _close_channels, self._channels)
        self._deaths = DeathWatch(self.processes, self._method, ring)
        self._handoff: Handoff | None = None
        _live_pools.add(self)
        try:
            # Every worker gets the same source and worker_init: check once,
            # and pickle them once (if the start method pickles at all;
            # threads use them as they are).
            first = configs[0]
            assert all(
                c.source is first.source and c.worker_init is first.worker_init
                for c in configs
            )
            if not threads:
                objs = {"source": first.source, "worker_init": first.worker_init}
                unread = before_workers_start(objs)
                warn_of_copied_objects(objs, self._method, unread)
                self._handoff = handoff_for_workers((first.source, first.worker_init))
            for cfg in configs:
                cfg.handoff = self._handoff
            for cfg in configs:
                if not threads:  # a thread's stack is read directly
                    cfg.stack_file = self._deaths.stack_file()
                child_end = None
                if ring is None:
                    mine, child_end = ctx.Pipe(duplex=True)
                    self._channels.append(mine)
                    cfg.channel = child_end
                p = ctx.Process(
                    target=worker_main,
                    args=(cfg,),
                    name=f"fastq-worker-{cfg.worker_id}",
                    daemon=True,
                )
                # Known before it starts: an interrupt raised as start()
                # returns must not leave it unreaped.
                self.processes.append(p)
                try:
                    self._start(p, ctx)
                finally:
                    if child_end is not None:
                        child_end.close()
                        cfg.channel = None
            if ring is not None:
                self._watch_ring(ring)
        except BaseException:
            self.close()
            raise

    def _watch_ring(self, ring: Ring) -> None:
        self._ring = ring
        self._deaths.start(ring, self._died)

    def _died(self, failure: WorkerDied) -> None:
        if self.failure is None:
            self.failure = failure

    def check_deaths(self) -> None:
        """Records a death that the watching thread has not reported yet
        (on a loaded machine it may not have run since): the loop asks at
        an epoch's or a pass's end, which must not pass for a clean one."""
        if self.failure is None:
            dead = self._deaths.dead_now()
            if dead is not None:
                self._died(dead)

    def fail(self, failure: SharedMemoryError) -> None:
        """The ring's memory could not be reserved (NOTE [ The ring is
        handed over before it is settled ]): the run ends with that at the
        loop's next batch, also where a worker died of it first (SIGBUS on
        a page that could not be had)."""
        self.failure = failure

    # ------------------------------------------------ spec from a worker

    def receive_spec(self, timeout: float | None, item: str = "batch") -> Any:
        """The spec inferred from a first item (a "batch", or a "sample" of
        a sample stream), which its worker keeps and delivers once the ring
        exists: worker 0's, or, while a worker's stream is empty (fewer
        shards than workers), the next worker's, all within one
        ``timeout``. Raises what went wrong there: the source's own
        exception as a WorkerError, a source empty in every worker, a
        death, or a timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for worker in range(self.size):
            if worker:
                self.ask_first(worker, ProbeStream(fresh=True))  # its own stream
            spec = stream_spec(
                self.receive_first(worker, timeout, item, deadline),
                worker=worker,
                pid=self.processes[worker].pid,
                where=f"its first {item}",
            )
            if spec is not None:
                return spec  # a BatchSpec, or a PackedSpec
        raise self.empty_error()

    def receive_first(
        self,
        worker: int,
        timeout: float | None,
        item: str = "batch",
        deadline: float | None = None,
    ) -> Answer:
        """What a worker answered about its first item (fastq._workers._handshake).
        Raises its death, or a timeout (``timeout`` from now, or at
        ``deadline``)."""
        return self.receive_any([worker], timeout, item, deadline)[1]

    def receive_any(
        self,
        workers: Sequence[int],
        timeout: float | None,
        item: str = "batch",
        deadline: float | None = None,
    ) -> tuple[int, Answer]:
        """The first answer any of ``workers`` gives about its first item,
        and whose. Raises any worker's death, or a timeout (``timeout``
        from now, or at ``deadline``)."""
        conns = {self._channels[w]: w for w in workers}
        sentinels = {p.sentinel: w for w, p in enumerate(self.processes)}
        if deadline is None and timeout is not None:
            deadline = time.monotonic() + timeout
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                who = ", ".join(str(w) for w in workers)
                who = f"worker{'s' if len(workers) > 1 else ''} {who}"
                raise FetchTimeout(
                    f"{who} made no first {item} within timeout="
                    f"{timeout} s, so slots could not be sized; raise timeout= "
                    "or pass spec={name: (shape, dtype)} (a sample's shape in a "
                    "stream of samples, a batch's otherwise)",
                    worker=workers[0],
                )
            ready = wait([*conns, *sentinels], None if left is None else min(left, 1.0))
            for obj in ready:
                if obj in conns:
                    w = conns[obj]
                    try:
                        return w, receive_answer(self._channels[w])
                    except EOFError:
                        # The worker is gone: its sentinel says how, within a
                        # moment.
                        ready = wait(list(sentinels), 1.0) or list(sentinels)[:1]
                        break
            for s in ready:
                if s in sentinels:
                    self.failure = self._deaths.diagnose(sentinels[s])
                    raise self.failure

    @staticmethod
    def empty_error() -> EmptySource:
        return EmptySource(
            "the source yielded no item in any worker, so its spec cannot be "
            "inferred; pass spec={name: (shape, dtype)} (a sample's shape in "
            "a stream of samples, a batch's otherwise)"
        )

    def ask_first(self, worker: int, order: Probe) -> None:
        """Asks a worker for another first batch: a planned task's, or an
        iterable's next item (from a fresh iterator, or its own)."""
        probe(self._channels[worker], order)  # a death: receive_first says so

    def send_region(
        self,
        region: Region,
        size: int,
        spec: Any,
        ring: Ring,
        plan: PlanLayout | None = None,
        kept: Sequence[int] = (),
    ) -> None:
        """Hands every worker the ring (its descriptor over the worker's
        socket, as multiprocessing passes descriptors) and starts watching;
        ``kept``: the tasks claimed for the workers that made them."""
        ready = RingReady(size, spec, plan, tuple(kept))
        for conn, p in zip(self._channels, self.processes):
            hand_over(conn, p.pid, region.fd, ready)
        self._watch_ring(ring)

    @staticmethod
    def _start(p: Any, ctx: Any) -> None:
        try:
            with _sigint_held(ctx.get_start_method()), _no_missing_main_file():
                p.start()
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            # The user's objects are pickled apart (fastq/_workers/_handoff.py, which
            # names the fix); what is left is the rest of the worker's set-up.
            method = ctx.get_start_method()
            raise ConfigError(
                f"a worker could not be started with start_method={method!r}: "
                f"{exc}. Leave start_method unset, so that workers fork"
            ) from exc

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    @property
    def size(self) -> int:
        return len(self.processes)

    def holders(self) -> list[tuple[int, int]]:
        """(worker, task) for every batch a worker is producing, from the
        slot census."""
        if self._ring is None:
            return []
        return [
            (who, task)
            for kind, who, task in self._ring.census()
            if kind == OWNER_WORKER and task != NO_TASK
        ]

    def stack_of(self, wid: int) -> str:
        """The worker's Python stack (DeathWatch.stack_of)."""
        return self._deaths.stack_of(wid)

    def close(self) -> None:
        """Bounded: close the ring (wakes every waiter), give workers
        GRACE_SECONDS to leave, SIGKILL the rest, reap everyone."""
        if os.getpid() != self._pid or self._closing:
            return
        self._closing = True
        self._deaths.stop()
        if self._ring is not None:
            self._ring.close()
        _close_channels(self._channels)  # a worker waiting for the ring leaves
        alive = [p for p in self.processes if p.pid is not None]
        try:
            self._reap(alive, GRACE_SECONDS)
        except KeyboardInterrupt:
            # Ctrl+C again while waiting for workers to leave: no more
            # grace, but the teardown still ends, then the interrupt goes on.
            self._reap(alive, 0.0)
            raise
        finally:
            self._deaths.close()
            for p in self.processes:
                if isinstance(p, ThreadWorker):
                    p.close()
            if self._handoff is not None:
                self._handoff.close()

    def _reap(self, alive: list[Any], grace: float) -> None:
        """Gives workers `grace` seconds to leave, SIGKILLs the rest, reaps
        everyone and the watcher."""
        deadline = time.monotonic() + grace
        pending = alive
        while pending and time.monotonic() < deadline:
            wait([p.sentinel for p in pending], deadline - time.monotonic())
            pending = [p for p in pending if p.exitcode is None]
        for p in pending:
            if p.exitcode is None:
                p.kill()
        for p in alive:
            p.join(2.0)
        self._deaths.join(1.0)
