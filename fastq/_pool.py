"""Worker processes: start method, start, death watch and bounded teardown."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import signal
import sys
import threading
import time
import types
from collections.abc import Iterator
from multiprocessing.connection import wait
from typing import Any

from ._ring import NO_TASK, OWNER_READY, OWNER_WORKER, READY, Ring
from ._shm import SharedFd, anonymous_file
from ._worker import WorkerConfig, worker_main
from .errors import ConfigError, WorkerDied

START_METHODS = ("fork", "spawn", "forkserver")
# How long close() lets workers leave on their own before SIGKILL: long
# enough for a worker between batches, short enough to bound close().
GRACE_SECONDS = 0.5


def default_start_method() -> str:
    """forkserver where it exists (safe in a threaded parent, cheap after the
    first start), else spawn: the same answer on every Python version."""
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


def get_context(start_method: str | None) -> Any:
    method = default_start_method() if start_method is None else start_method
    if method not in START_METHODS or method not in mp.get_all_start_methods():
        raise ConfigError(
            f"start_method={start_method!r} is not available here; use one of "
            f"{[m for m in START_METHODS if m in mp.get_all_start_methods()]}"
        )
    if method == "fork":
        _refuse_fork_after_cuda()
    ctx = mp.get_context(method)
    if method == "forkserver":
        # Workers fork from a server that already imported fastq, numpy and
        # the main module (and what it imports, torch for one), instead of
        # each worker importing them again. The main module must be
        # import-safe (`if __name__ == "__main__":`), as under spawn.
        ctx.set_forkserver_preload(["__main__", "fastq._worker"])
    return ctx


def _refuse_fork_after_cuda() -> None:
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        initialised = bool(cuda is not None and cuda.is_initialized())
    except Exception:  # a torch build without CUDA support
        initialised = False
    if initialised:
        raise ConfigError(
            "start_method='fork': CUDA is already initialised in this process, "
            "and a forked child cannot use it (it would crash or hang); use "
            "start_method='forkserver' or 'spawn', or create the Prefetcher "
            "before touching CUDA"
        )


def _exit_description(exitcode: int | None) -> tuple[str, str]:
    if exitcode is None:
        return "is gone", ""
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = {
            "SIGKILL": "; SIGKILL usually means the out-of-memory killer: check "
            "`dmesg` and lower memory use per worker or the number of workers",
            "SIGSEGV": "; a segmentation fault in native code the worker ran",
            "SIGBUS": "; a bus error: memory backing a mapping went away",
        }.get(name, "")
        return f"was killed by {name}", hint
    return f"exited with code {exitcode}", (
        "; user code called sys.exit() or os._exit(), or the worker failed "
        "outside any batch (its traceback is on stderr)"
    )


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """Children start with SIGINT ignored (the disposition survives fork and
    exec), so a Ctrl+C while a worker boots cannot print its traceback; the
    worker keeps ignoring it, and the consumer alone handles Ctrl+C."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        # A Ctrl+C that arrived meanwhile was dropped; the next one works.


class _Discard:
    def write(self, data: bytes) -> int:
        return len(data)


def _check_main_importable(method: str, cfg: WorkerConfig) -> None:
    if method == "fork":  # workers inherit __main__ as it is
        return
    names = _unimportable_main_names(cfg)
    if names:
        raise ConfigError(
            f"the source or worker_init uses {', '.join(names)}, defined in the "
            "__main__ of `python -c`, standard input, an interactive session or "
            f"a notebook, which start_method={method!r} workers cannot import. "
            "Move it into a module you import, or use start_method='fork'"
        )


def _unimportable_main_names(obj: Any) -> list[str]:
    """Classes and functions that obj's pickle takes from a __main__ with no
    file behind it: a spawned or forkserver worker re-imports __main__ from
    its file, so these would fail there with an AttributeError."""
    main = sys.modules.get("__main__")
    if main is None or getattr(main, "__file__", None):
        return []
    found: list[str] = []

    class Finder(pickle.Pickler):
        def persistent_id(self, o: Any) -> None:
            if (
                isinstance(o, (type, types.FunctionType))
                and getattr(o, "__module__", None) == "__main__"
                and o.__qualname__ not in found
            ):
                found.append(o.__qualname__)

    try:
        Finder(_Discard(), protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    except Exception:  # start() reports what cannot be pickled
        return []
    return found


class WorkerPool:
    """Starts the workers and watches them; a death alerts the consumer."""

    def __init__(self, ctx: Any, configs: list[WorkerConfig], ring: Ring) -> None:
        self._ring = ring
        self._pid = os.getpid()
        self.failure: WorkerDied | None = None
        self._closing = False
        self.processes: list[Any] = []
        self._stop_r, self._stop_w = os.pipe()
        self._stack_fds: list[int] = []
        try:
            # Every worker gets the same source and worker_init: check once.
            _check_main_importable(ctx.get_start_method(), configs[0])
            for cfg in configs:
                fd = anonymous_file("fastq-stack")
                self._stack_fds.append(fd)
                cfg.stack_file = SharedFd(fd)
                p = ctx.Process(
                    target=worker_main,
                    args=(cfg,),
                    name=f"fastq-worker-{cfg.worker_id}",
                    daemon=True,
                )
                self._start(p, ctx)
                self.processes.append(p)
        except BaseException:
            self.close()
            raise
        self._watcher = threading.Thread(
            target=self._watch, name="fastq-death-watcher", daemon=True
        )
        self._watcher.start()

    @staticmethod
    def _start(p: Any, ctx: Any) -> None:
        try:
            with _sigint_ignored():
                p.start()
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            method = ctx.get_start_method()
            raise ConfigError(
                f"the source or worker_init cannot be pickled for "
                f"start_method={method!r}: {exc}. Define them at module level "
                "(no lambdas, local functions or open handles), or use "
                "start_method='fork'"
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
        return [
            (who, task)
            for kind, who, task in self._ring.census()
            if kind == OWNER_WORKER and task != NO_TASK
        ]

    def stack_of(self, wid: int) -> str:
        """The worker's Python stack, dumped by its faulthandler on SIGUSR1;
        empty if it cannot be had within a fraction of a second."""
        fd = self._stack_fds[wid]
        before = os.fstat(fd).st_size
        try:
            os.kill(self.processes[wid].pid, signal.SIGUSR1)
        except OSError:
            return ""
        # The dump is written from the signal handler in microseconds; the
        # bound only covers a worker that is not scheduled right away.
        deadline = time.monotonic() + 0.5
        size = before
        while time.monotonic() < deadline:
            time.sleep(0.01)
            now = os.fstat(fd).st_size
            if now > before and now == size:
                break
            size = now
        return os.pread(fd, size - before, before).decode(errors="replace")

    def _watch(self) -> None:
        sentinels = {p.sentinel: i for i, p in enumerate(self.processes)}
        ready = wait([*sentinels, self._stop_r])
        if self._closing or self._stop_r in ready:
            return
        for s in ready:
            if s in sentinels:
                self._record_death(sentinels[s])
                break
        self._ring.alert()

    def _record_death(self, wid: int) -> None:
        p = self.processes[wid]
        p.join(0.1)
        how, hint = _exit_description(p.exitcode)
        held, task, claiming = self._what_it_held(wid)
        self.failure = WorkerDied(
            f"worker {wid} (pid {p.pid}) {how}{held}{hint}",
            worker=wid,
            pid=p.pid,
            exitcode=p.exitcode,
            task=task,
            claiming=claiming,
        )

    def _what_it_held(self, wid: int) -> tuple[str, int | None, bool]:
        """From the slot census: (words for the message, the batch it took
        with it or None, whether it died between a claim and its record)."""
        ring = self._ring
        for slot, (kind, who, task) in enumerate(ring.census()):
            if who != wid:
                continue
            if kind == OWNER_WORKER and task != NO_TASK:
                return f" while producing batch {task} (slot {slot})", task, False
            if kind == OWNER_WORKER:
                return (
                    f" holding slot {slot} before its next batch was recorded",
                    None,
                    True,
                )
            if kind == OWNER_READY and not ring.queued(READY, slot):
                return (
                    f" while publishing batch {task} (slot {slot}), which is lost",
                    task,
                    False,
                )
        return "", None, False

    def close(self) -> None:
        """Bounded: close the ring (wakes every waiter), give workers
        GRACE_SECONDS to leave, SIGKILL the rest, reap everyone."""
        if os.getpid() != self._pid or self._closing:
            return
        self._closing = True
        self._ring.close()
        os.write(self._stop_w, b"x")
        alive = [p for p in self.processes if p.pid is not None]
        deadline = time.monotonic() + GRACE_SECONDS
        pending = alive
        while pending and time.monotonic() < deadline:
            wait([p.sentinel for p in pending], deadline - time.monotonic())
            pending = [p for p in pending if p.exitcode is None]
        for p in pending:
            if p.exitcode is None:
                p.kill()
        for p in alive:
            p.join(2.0)
        watcher = getattr(self, "_watcher", None)
        if watcher is not None:
            watcher.join(1.0)
        for fd in [self._stop_r, self._stop_w, *self._stack_fds]:
            os.close(fd)
        self._stack_fds = []
