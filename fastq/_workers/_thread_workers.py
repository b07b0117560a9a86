"""Thread workers (``worker_method="thread"``): the worker loop of
fastq/_workers/_worker.py run in threads of the consumer's process, behind the small
part of multiprocessing's context that WorkerPool uses, so the ring, the
death watch and the bounded close are the same code for both methods.

What differs, and why:

- Nothing is pickled and no process starts: every thread works on the
  source object itself, which must therefore be safe to use from several
  threads at once.
- The process belongs to the training loop: thread workers change neither
  its signal handlers, nor its BLAS/OpenMP pools (``worker_threads`` does
  not apply), nor the global ``random`` / ``np.random`` state. A batch's
  reproducible randomness is ``fastq.get_worker_info().rng``, seeded from
  (seed, epoch, batch) as in process workers.
- A thread cannot be killed. ``close()`` wakes every worker waiting on the
  ring and waits a bounded time for them; a thread stuck in user code is
  left to finish its call, after which it finds the ring closed and ends.
  It keeps its own mapping of the ring, so nothing it touches is unmapped
  under it, and it is a daemon thread, so it never holds up the exit of
  the interpreter.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import sys
import threading
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from .._core._memfd import SharedFd

METHOD = "thread"


class ThreadWorker:
    """A worker thread with the face of a multiprocessing.Process that
    WorkerPool uses: ``pid`` (this process's), ``sentinel`` (a descriptor
    readable once the thread has ended), ``exitcode`` (None while it runs;
    0, or 1 if it ended with an exception, kept in ``error``), ``join``
    and ``kill`` (which cannot stop a thread: it only stops waiting)."""

    def __init__(
        self,
        target: Callable[[Any], None],
        args: tuple[Any],
        name: str,
        daemon: bool = True,
    ) -> None:
        self._target = target
        (self._cfg,) = args
        self.name = name
        self.pid: int | None = None
        self.exitcode: int | None = None
        self.error = ""
        self._abandoned = False
        self._ended_r, self._ended_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    @property
    def sentinel(self) -> int:
        return self._ended_r

    @property
    def ident(self) -> int | None:
        return self._thread.ident

    def start(self) -> None:
        """The thread gets its own copy of the config, holding its own
        descriptors, as a process would: the worker closes those it was
        given (the region's once mapped, its channel once the ring is
        there), and the pool closes its copies once the worker started."""
        cfg = self._cfg
        region = None if cfg.region is None else SharedFd(os.dup(cfg.region.fd))
        channel = None
        if cfg.channel is not None:
            channel = Connection(os.dup(cfg.channel.fileno()))
        self._cfg = dataclasses.replace(
            cfg, in_thread=True, region=region, channel=channel
        )
        self.pid = os.getpid()
        self._thread.start()

    def _run(self) -> None:
        code = 1
        try:
            self._target(self._cfg)
            code = 0
        except BaseException as exc:  # a thread has no one else to tell
            self.error = "".join(traceback.format_exception_only(type(exc), exc))
        finally:
            self.exitcode = code
            with contextlib.suppress(OSError):
                os.write(self._ended_w, b"x")

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        if not self._abandoned:
            self._thread.join(timeout)

    def close(self) -> None:
        """Releases the sentinel once the thread has ended; a thread still
        running writes to it when it ends, so it is released then."""
        if not self._thread.is_alive():
            self._close_fds()

    def kill(self) -> None:
        """A thread cannot be killed: stop waiting for it. It ends on its
        own once its user code returns and it finds the ring closed."""
        self._abandoned = True

    def stack(self) -> str:
        """The thread's Python stack, as a process worker's SIGUSR1 dump."""
        frame = sys._current_frames().get(self._thread.ident or -1)
        if frame is None:
            return ""
        return "".join(traceback.format_stack(frame))

    def _close_fds(self) -> None:
        for fd in (self._ended_r, self._ended_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._ended_r = self._ended_w = -1

    def __del__(self, _close: Callable[[int], None] = os.close) -> None:
        # Only once the thread has ended: _run holds this object until then.
        # os.close is bound here: at interpreter exit this module's globals
        # may be None already.
        for fd in (self._ended_r, self._ended_w):
            if fd >= 0:
                try:  # noqa: SIM105 (contextlib is a module global)
                    _close(fd)
                except OSError:
                    pass
        self._ended_r = self._ended_w = -1


class ThreadContext:
    """What WorkerPool asks of a multiprocessing context, for threads."""

    Process = ThreadWorker

    @staticmethod
    def Pipe(duplex: bool = True) -> tuple[Any, Any]:
        return multiprocessing.Pipe(duplex)

    @staticmethod
    def get_start_method() -> str:
        return METHOD


__all__ = ["METHOD", "ThreadContext", "ThreadWorker"]
