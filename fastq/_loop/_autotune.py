"""workers="auto": start a worker per usable CPU, run as many as keep the
consumer fed, park the rest.

A thread in the consumer's process closes a measurement window every half
second or so and hands it to `Policy`, which decides from four figures:
the share of the window the consumer waited for a batch, the batches
delivered, the CPUs that stood idle (this process's CPUs, from
/proc/stat), and the active workers' time waiting for a free slot. It
unparks workers while the consumer waits and CPUs are idle, keeps a change
only if it delivered more batches, and parks workers the consumer does not
need. Parking is one word in the ring (`Ring.set_active`): a parked worker
sleeps before taking a slot, so it holds no slot and no task, and order,
exactly-once delivery and resume are as with a fixed number of workers.
Every decision, and why, is in `stats()["autotune"]`.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Workers running when the loop starts; the others are parked from the
# start, so that none makes a batch the first window would count.
AUTO_START = 1
# A window closes after this long, once it holds enough batches to judge.
WINDOW_S = 0.5
WINDOW_BATCHES = 4
# ... or after this long whatever it holds; fewer than 2 batches: no verdict.
WINDOW_MAX_S = 3.0
TICK_S = 0.1

# The consumer is starved when it waits more than this share of a window.
STARVED = 0.05
# A change is kept if the next judged window delivers this much more.
GAIN = 1.05
# Workers are parked only after this many windows in a row with the
# consumer never waiting and the workers waiting for free slots.
SURPLUS_WINDOWS = 3
IDLE_WAIT = 0.5  # an active worker's share of time waiting for a free slot
HEADROOM = 1.25  # workers kept per CPU's worth of production the loop uses
# Windows to hold still after a change was undone for want of a gain.
HOLD_WINDOWS = 20
LOG_SIZE = 32


@dataclass(frozen=True)
class Window:
    """What one measurement window saw."""

    seconds: float
    batches: int  # delivered to the loop
    made: int  # published by the workers: their rate, whatever the ring holds
    consumer_wait: float  # share of the window the consumer waited
    worker_busy: float  # CPUs' worth of production by the active workers
    worker_wait: float  # active workers' mean share waiting for a slot
    idle_cpus: float  # CPUs of this process's set that stood idle

    @property
    def rate(self) -> float:
        """Batches/s the workers made: the loop's rate plus what the ring
        gained, so a ring filling or draining does not count as a change."""
        return self.made / self.seconds if self.seconds > 0 else 0.0


class Policy:
    """Decides the number of active workers from successive windows.

    Pure: no clock, no ring; `decide` returns the new count and the reason,
    or None to keep the current one. `events` lists every change and every
    verdict on one, as (workers, why), for the caller to collect.
    """

    def __init__(self, pool: int, active: int = AUTO_START) -> None:
        self.pool = pool
        self.active = max(1, min(pool, active))
        self.reason = f"started with {self.active} of {pool} workers"
        self.events: list[tuple[int, str]] = [(self.active, self.reason)]
        self._trial: tuple[int, float] | None = None  # (count before, its rate)
        self._settling = False  # the window after a change: not judged
        self._surplus = 0
        self._hold = 0

    def decide(self, w: Window) -> tuple[int, str] | None:
        if w.batches < 2:
            return None  # the loop is elsewhere (validation, a pause)
        if self._settling:  # a started worker's first batch is in it
            self._settling = False
            return None
        if self._trial is not None:
            return self._judge_trial(w)
        if self._hold:
            self._hold -= 1
        if w.consumer_wait > STARVED:
            self._surplus = 0
            return self._grow(w)
        if w.consumer_wait < STARVED / 5 and w.worker_wait > IDLE_WAIT:
            self._surplus += 1
            if self._surplus >= SURPLUS_WINDOWS:
                self._surplus = 0
                return self._shrink(w)
        else:
            self._surplus = 0
        return None

    def _grow(self, w: Window) -> tuple[int, str] | None:
        if self.active >= self.pool or self._hold:
            return None
        # The consumer's waiting is CPU a worker could have too: it spins
        # briefly before it sleeps, and would not wait with enough workers.
        spare = w.idle_cpus + w.consumer_wait
        if spare < 0.5:
            self.reason = (
                f"the consumer waits {w.consumer_wait:.0%} of the time, but no "
                f"CPU is idle: {self.active} workers"
            )
            return None
        # Producing (1 - wait) of what the loop would take: scale the
        # workers to match, no further than the spare CPUs allow.
        wait = min(w.consumer_wait, 0.95)
        want = math.ceil(self.active * wait / (1.0 - wait))
        step = max(1, min(want, int(spare + 0.5), self.pool - self.active))
        before = self.active
        self._trial = (before, w.rate)
        return self._change(
            before + step,
            f"the consumer waited {w.consumer_wait:.0%} of the time with "
            f"{w.idle_cpus:.1f} CPUs idle: {before} -> {before + step} workers",
        )

    def _judge_trial(self, w: Window) -> tuple[int, str] | None:
        assert self._trial is not None
        before, rate_before = self._trial
        self._trial = None
        if w.rate >= rate_before * GAIN:
            self.reason += f" (kept: {rate_before:.1f} -> {w.rate:.1f} batches/s)"
            self.events.append((self.active, self.reason))
            return None
        self._hold = HOLD_WINDOWS
        return self._change(
            before,
            f"{self.active} workers delivered no more than {before} "
            f"({rate_before:.1f} -> {w.rate:.1f} batches/s): back to {before}, "
            "the limit is elsewhere",
        )

    def _shrink(self, w: Window) -> tuple[int, str] | None:
        need = max(1, math.ceil(w.worker_busy * HEADROOM))
        if need >= self.active:
            return None
        before = self.active
        return self._change(
            need,
            f"the consumer never waited and the workers waited for a free slot "
            f"{w.worker_wait:.0%} of the time: {before} -> {need} workers",
        )

    def _change(self, active: int, reason: str) -> tuple[int, str]:
        self.active = active
        self.reason = reason
        self._settling = True
        self.events.append((active, reason))
        return active, reason


def cpu_budget() -> int:
    """CPUs this process may use: its affinity set, within a cgroup v2 CPU
    quota (a container's --cpus) where one is set."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()
        if quota != "max":
            cpus = min(cpus, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return cpus


class IdleCpus:
    """Idle CPU time of this process's CPUs between calls, from /proc/stat."""

    def __init__(self) -> None:
        try:
            self._cpus = {f"cpu{c}" for c in os.sched_getaffinity(0)}
        except AttributeError:
            self._cpus = set()
        self._last = self._read()

    def _read(self) -> tuple[int, int] | None:
        idle = total = 0
        try:
            with open("/proc/stat") as f:
                for line in f:
                    if not line.startswith("cpu") or line.startswith("cpu "):
                        continue
                    name, *fields = line.split()
                    if self._cpus and name not in self._cpus:
                        continue
                    ticks = [int(x) for x in fields[:8]]
                    idle += ticks[3] + ticks[4]  # idle, iowait
                    total += sum(ticks)
        except (OSError, ValueError, IndexError):
            return None
        return idle, total

    def since_last(self, cpus: int) -> float:
        """CPUs' worth of idle time since the last call (0 when unknown)."""
        now = self._read()
        last, self._last = self._last, now
        if now is None or last is None or now[1] <= last[1]:
            return 0.0
        share = (now[0] - last[0]) / (now[1] - last[1])
        return share * (len(self._cpus) or cpus)


@dataclass(frozen=True)
class Sample:
    """The counters at one moment."""

    t: float
    delivered: int
    made: int
    wait_ns: int
    active: list[tuple[int, int]]  # each active worker's (busy ns, wait ns)


class Autotuner:
    """The thread that measures windows and applies `Policy`'s decisions
    to the ring, whose workers were parked down to AUTO_START before any
    started. `counters()` gives (batches delivered, consumer wait ns);
    the ring's `worker_stats(w)` gives (batches, busy ns, wait ns, pid)."""

    def __init__(
        self,
        ring: Any,
        pool: int,
        counters: Callable[[], tuple[int, int]],
    ) -> None:
        self._ring = ring
        self._counters = counters
        self.policy = Policy(pool)
        self.log: list[dict[str, Any]] = []
        self._t0 = time.monotonic()
        self._collect()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="fastq-autotune", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stops the thread and waits for it, so that none outlives close()."""
        self._stop.set()
        if (
            self._thread.is_alive()
            and self._thread is not threading.current_thread()
            # At interpreter exit the thread never runs again (NOTE [ A
            # region closed at interpreter exit ] in fastq/_core/_shm.py).
            and not sys.is_finalizing()
        ):
            self._thread.join()

    def report(self) -> dict[str, Any]:
        return {
            "workers": self.policy.active,
            "pool": self.policy.pool,
            "why": self.policy.reason,
            "decisions": list(self.log),
        }

    def _collect(self) -> None:
        at = round(time.monotonic() - self._t0, 3)
        for workers, why in self.policy.events:
            self.log.append({"at_s": at, "workers": workers, "why": why})
        self.policy.events.clear()
        del self.log[:-LOG_SIZE]

    def _sample(self) -> Sample:
        batches, wait_ns = self._counters()
        ring = self._ring
        stats = [ring.worker_stats(w) for w in range(self.policy.pool)]
        active = [s[1:3] for s in stats[: self.policy.active]]
        made = sum(s[0] for s in stats)
        return Sample(time.monotonic(), batches, made, wait_ns, active)

    def _run(self) -> None:
        idle = IdleCpus()
        start = self._sample()
        while not self._stop.wait(TICK_S):
            now = self._sample()
            seconds = now.t - start.t
            batches = now.delivered - start.delivered
            if seconds < WINDOW_S or (
                batches < WINDOW_BATCHES and seconds < WINDOW_MAX_S
            ):
                continue
            window = self._window(start, now, idle.since_last(self.policy.pool))
            decision = self.policy.decide(window)
            if decision is not None:
                self._ring.set_active(decision[0])
            self._collect()
            start = self._sample()

    @staticmethod
    def _window(start: Sample, now: Sample, idle_cpus: float) -> Window:
        seconds = now.t - start.t
        ns = seconds * 1e9
        active = list(zip(start.active, now.active))
        busy = sum(b1 - b0 for (b0, _), (b1, _) in active) / ns
        waits = [(w1 - w0) / ns for (_, w0), (_, w1) in active]
        return Window(
            seconds=seconds,
            batches=now.delivered - start.delivered,
            made=now.made - start.made,
            consumer_wait=min(1.0, (now.wait_ns - start.wait_ns) / ns),
            worker_busy=busy,
            worker_wait=sum(waits) / len(waits) if waits else 0.0,
            idle_cpus=idle_cpus,
        )
