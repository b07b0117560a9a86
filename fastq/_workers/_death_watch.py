"""A pool's death watch: a thread that wakes when a worker dies, what the
death is put down to (how it ended, what it held, why it could not start),
and a live worker's Python stack."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from multiprocessing.connection import wait
from typing import Any, Callable

from .._core._memfd import SharedFd, anonymous_file
from .._core._ring import NO_TASK, OWNER_READY, OWNER_WORKER, READY, Ring
from ..errors import WorkerDied
from ._config import STARTUP_NOTE
from ._thread_workers import ThreadWorker

# The exit code of a worker that found itself re-running the main script's
# Prefetcher while multiprocessing started it (no __main__ guard).
MAIN_REIMPORTED_EXIT = 86


def _main_path() -> str:
    # While multiprocessing re-runs the script in a new worker, the script
    # runs as __mp_main__, and __main__ is still the worker's bootstrap.
    for name in ("__mp_main__", "__main__"):
        path = getattr(sys.modules.get(name), "__file__", None)
        if isinstance(path, str) and path:
            return path
    return "the main script"


def main_reimported(method: str | None) -> str:
    path = _main_path()
    who = (
        "spawn and forkserver workers"
        if method is None
        else f"start_method={method!r} workers"
    )
    return (
        f"{who} import the main script ({path}) again, and it creates a "
        "Prefetcher at import time, so each worker tried to start workers of "
        "its own. Put the code that creates and "
        'iterates the Prefetcher under `if __name__ == "__main__":` (or in a '
        "function called from there), or use start_method='fork'"
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


class DeathWatch:
    """Watches a pool's workers (``processes``, the pool's own list, which
    they join as they start). Once the ring exists, a thread waits on
    their sentinels: the first death is diagnosed, handed to ``died``, and
    alerts the ring, which wakes the consumer. Each process worker has a
    stack file, where its faulthandler dumps its stack on SIGUSR1 and where
    it leaves why it could not start."""

    def __init__(self, processes: list[Any], method: str, ring: Ring | None) -> None:
        self.processes = processes
        self._method = method
        self._ring = ring
        self._stop_r, self._stop_w = os.pipe()
        self._stopped = False
        self._stack_fds: list[int] = []
        self._thread: threading.Thread | None = None

    def stack_file(self) -> SharedFd:
        """A new worker's stack file."""
        fd = anonymous_file("fastq-stack")
        self._stack_fds.append(fd)
        return SharedFd(fd)

    def start(self, ring: Ring, died: Callable[[WorkerDied], None]) -> None:
        """Watches the workers, now that they have the ring."""
        self._ring = ring
        self._thread = threading.Thread(
            target=self._watch, args=(died,), name="fastq-death-watcher", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """The pool closes: workers that leave now are not deaths."""
        self._stopped = True
        os.write(self._stop_w, b"x")

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def close(self) -> None:
        for fd in [self._stop_r, self._stop_w, *self._stack_fds]:
            os.close(fd)
        self._stack_fds = []

    def _watch(self, died: Callable[[WorkerDied], None]) -> None:
        dead = self._first_death(None)
        if dead is None:
            return  # the pool closes
        died(dead)
        assert self._ring is not None
        self._ring.alert()

    def dead_now(self) -> WorkerDied | None:
        """A worker already gone, diagnosed, whether or not the watching
        thread has had the CPU to report it yet; None if none is, or if the
        pool is closing or the ring does not exist yet. Does not wait."""
        if self._thread is None:
            return None
        return self._first_death(0)

    def _first_death(self, timeout: float | None) -> WorkerDied | None:
        """The first worker found gone within ``timeout`` (None: until one
        is), diagnosed; None at the timeout or once the pool closes."""
        sentinels = {p.sentinel: i for i, p in enumerate(self.processes)}
        ready = wait([*sentinels, self._stop_r], timeout)
        if not ready or self._stopped or self._stop_r in ready:
            return None
        return self.diagnose(sentinels[ready[0]])

    def diagnose(self, wid: int) -> WorkerDied:
        """The failure that worker `wid`, which is gone, stands for."""
        p = self.processes[wid]
        p.join(0.1)
        how, hint = _exit_description(p.exitcode)
        if isinstance(p, ThreadWorker):
            how = f"(a thread) ended outside any batch: {p.error.strip()}"
            hint = ""
        held, task, claiming = self._what_it_held(wid)
        message = f"worker {wid} (pid {p.pid}) {how}{held}{hint}"
        reason = self._startup_note(wid)
        if not reason and p.exitcode == MAIN_REIMPORTED_EXIT:
            reason = main_reimported(self._method)
        if reason:
            message = f"worker {wid} (pid {p.pid}) could not start ({how}): {reason}"
        return WorkerDied(
            message,
            worker=wid,
            pid=p.pid,
            exitcode=p.exitcode,
            task=task,
            claiming=claiming,
        )

    def _startup_note(self, wid: int) -> str:
        """Why the worker could not start, if it left that in its stack
        file (see _config.STARTUP_NOTE)."""
        try:
            data = os.pread(self._stack_fds[wid], 1 << 16, 0)
        except (OSError, IndexError):
            return ""
        if not data.startswith(STARTUP_NOTE):
            return ""
        return data[len(STARTUP_NOTE) :].decode(errors="replace")

    def _what_it_held(self, wid: int) -> tuple[str, int | None, bool]:
        """From the slot census: (words for the message, the batch it took
        with it or None, whether it died between a claim and its record)."""
        ring = self._ring
        if ring is None:
            return " before the ring existed", None, False
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
                # Either lost inside its push or being taken by the
                # consumer right now: this thread cannot tell which.
                return f" after publishing batch {task} (slot {slot})", None, False
        return "", None, False

    def stack_of(self, wid: int) -> str:
        """The worker's Python stack, dumped by its faulthandler on SIGUSR1;
        empty if it cannot be had within a fraction of a second."""
        worker = self.processes[wid]
        if isinstance(worker, ThreadWorker):
            return worker.stack()
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
