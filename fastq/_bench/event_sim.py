"""A discrete-event simulation kernel: processes written as generators, on a
simulated clock, over resources they hold and queues they pass items by.

The GPU-timeline model (fastq/_bench/gpu_timeline.py) runs on it, so that
its figures depend on its parameters alone, never on the load of the
machine that computes them: nothing here reads a clock or sleeps.

A process is a generator that yields events and is resumed, with the
event's value, once the event has happened::

    def worker(sim, cpu, out):
        while True:
            yield from cpu.hold(0.002)   # 2 ms on a core
            yield out.put("batch")

Everything happens in the order it was scheduled: two events at the same
simulated time run in the order they were made, so a run is deterministic.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Generator
from typing import Any

Process = Generator["Event", Any, Any]


class Event:
    """Something that happens once, at a simulated time; the processes
    waiting for it resume then, in the order they began to wait."""

    __slots__ = ("_callbacks", "_sim", "triggered", "value")

    def __init__(self, sim: Simulation) -> None:
        self._sim = sim
        self._callbacks: list[Callable[[Event], None]] = []
        self.triggered = False
        self.value: Any = None

    def succeed(self, value: Any = None) -> Event:
        """Happens now: its waiters resume at this simulated time."""
        if self.triggered:
            raise RuntimeError("an event happens once; this one has happened")
        self.triggered = True
        self.value = value
        for callback in self._callbacks:
            self._sim.soon(callback, self)
        self._callbacks.clear()
        return self

    def then(self, callback: Callable[[Event], None]) -> None:
        if self.triggered:
            self._sim.soon(callback, self)
        else:
            self._callbacks.append(callback)


class Simulation:
    """The clock and the queue of what happens next (a heap ordered by
    time, then by the order things were scheduled)."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[Event], None], Event]] = []
        self._made = 0

    def soon(self, callback: Callable[[Event], None], event: Event) -> None:
        self._at(self.now, callback, event)

    def _at(self, at: float, callback: Callable[[Event], None], event: Event) -> None:
        self._made += 1
        heapq.heappush(self._heap, (at, self._made, callback, event))

    def event(self) -> Event:
        return Event(self)

    def timeout(self, seconds: float) -> Event:
        """An event ``seconds`` of simulated time from now."""
        if seconds < 0:
            raise ValueError(f"seconds={seconds}: a timeout cannot be negative")
        event = Event(self)
        self._at(self.now + seconds, _happen, event)
        return event

    def process(self, body: Process) -> Event:
        """Starts ``body``; the event happens when it returns, with its
        return value."""
        done = Event(self)

        def resume(event: Event) -> None:
            try:
                waited = body.send(event.value)
            except StopIteration as stop:
                done.succeed(stop.value)
                return
            waited.then(resume)

        start = Event(self)
        start.then(resume)
        start.succeed()
        return done

    def run(self, until: Event | float | None = None) -> None:
        """Runs until ``until`` (an event, or a simulated time) or until
        nothing is left to happen."""
        heap = self._heap
        while heap:
            if isinstance(until, Event) and until.triggered:
                return
            at, _, callback, event = heap[0]
            if isinstance(until, (float, int)) and at > until:
                self.now = float(until)
                return
            heapq.heappop(heap)
            self.now = at
            callback(event)
        if isinstance(until, Event) and not until.triggered:
            raise RuntimeError("the simulation ran out of events before `until`")


def _happen(event: Event) -> None:
    event.succeed()


class Resource:
    """``capacity`` identical units (cores, the GIL, an engine), granted in
    the order they were asked for; counts the unit-seconds held, so that
    ``busy(since)`` is the share of the units in use."""

    def __init__(self, sim: Simulation, name: str, capacity: int = 1) -> None:
        if capacity < 1:
            raise ValueError(f"{name}: capacity={capacity}: at least one unit")
        self.sim = sim
        self.name = name
        self.capacity = capacity
        self.in_use = 0
        self._waiting: deque[Event] = deque()
        self._held_s = 0.0  # unit-seconds, up to _since
        self._since = 0.0

    def _account(self) -> None:
        self._held_s += self.in_use * (self.sim.now - self._since)
        self._since = self.sim.now

    def request(self) -> Event:
        """An event that happens when a unit is this caller's."""
        event = self.sim.event()
        if self.in_use < self.capacity and not self._waiting:
            self._account()
            self.in_use += 1
            event.succeed()
        else:
            self._waiting.append(event)
        return event

    def release(self) -> None:
        if self._waiting:
            self._waiting.popleft().succeed()  # the unit passes on
            return
        self._account()
        self.in_use -= 1

    def hold(self, seconds: float) -> Process:
        """Takes a unit, keeps it ``seconds``, gives it back."""
        yield self.request()
        yield self.sim.timeout(seconds)
        self.release()

    def held_s(self) -> float:
        """Unit-seconds held since the start."""
        self._account()
        return self._held_s


class Queue:
    """A bounded queue of items between processes: ``put`` waits while it
    holds ``size`` items, ``get`` while it holds none."""

    def __init__(self, sim: Simulation, size: int) -> None:
        if size < 1:
            raise ValueError(f"size={size}: a queue holds at least one item")
        self.sim = sim
        self.size = size
        self.items: deque[Any] = deque()
        self._getters: deque[Event] = deque()
        self._putters: deque[tuple[Event, Any]] = deque()

    def put(self, item: Any) -> Event:
        event = self.sim.event()
        if self._getters:
            self._getters.popleft().succeed(item)
            event.succeed()
        elif len(self.items) < self.size:
            self.items.append(item)
            event.succeed()
        else:
            self._putters.append((event, item))
        return event

    def get(self) -> Event:
        event = self.sim.event()
        if self.items:
            event.succeed(self.items.popleft())
            if self._putters:
                put, item = self._putters.popleft()
                self.items.append(item)
                put.succeed()
        else:
            self._getters.append(event)
        return event
