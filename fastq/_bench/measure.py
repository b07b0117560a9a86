"""One case, measured in this process: time to the first batch, warm-up,
then timed blocks of batches (the median block is the steady-state rate),
with both sides' CPU time, page faults and, optionally, system calls."""

from __future__ import annotations

import gc
import os
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from . import procstat
from .transports import TRANSPORTS, Case, Feed, first_leaf
from .workloads import read_stamp


@dataclass
class Budget:
    seconds: float = 3.0  # measured seconds per case, after warm-up
    warmup_s: float = 0.5  # warm-up: at least this long and 3 batches
    blocks: int = 5  # the median of this many timed blocks is reported


@dataclass
class Options:
    perf: bool = False  # count system calls with `perf stat`
    consumer_step_s: float = 0  # busy work per batch in the consumer
    first_only: bool = False  # stop after the first batch (start-up runs)
    # Time each next() alone, with the producers ahead (the hand-over
    # section): the consumer's own cost per batch, no waiting in it.
    drain: bool = False
    note: str = ""  # added to the result's notes
    # FASTQ_SPIN_US for the case's process (isolated runs only): how long
    # fastq's waiters spin before they sleep.
    spin_us: int | None = None


@dataclass
class Side:
    """Per-batch costs of one side (the consumer, or all producers)."""

    cpu_us: float = 0.0
    minflt: float = 0.0
    csw: float = 0.0
    syscalls: float | None = None
    futex: float | None = None


@dataclass
class Result:
    case: dict[str, Any]
    label: str
    batch_bytes: int = 0
    batches: int = 0
    seconds: float = 0.0
    block_rates: list[float] = field(default_factory=list)
    first_batch_s: float = 0.0
    consumer: Side = field(default_factory=Side)
    producers: Side = field(default_factory=Side)
    pss_bytes: int = 0
    latency_us: dict[str, float] = field(default_factory=dict)
    next_us: dict[str, float] = field(default_factory=dict)  # drain runs
    mean_ready: float | None = None
    autotune: dict[str, Any] | None = None  # workers="auto": what it chose
    busy_before: float | None = None  # share of the CPUs busy before it ran
    repeats: list[float] = field(default_factory=list)  # batches/s of each run
    notes: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def batches_per_s(self) -> float:
        if self.block_rates:
            return statistics.median(self.block_rates)
        return self.batches / self.seconds if self.seconds else 0.0

    @property
    def gb_per_s(self) -> float:
        return self.batches_per_s * self.batch_bytes / 1e9

    @property
    def us_per_batch(self) -> float:
        r = self.batches_per_s
        return 1e6 / r if r else float("inf")

    @property
    def spread(self) -> float:
        """(max - min) / median of the block rates: how steady it was."""
        if len(self.block_rates) < 2 or not self.batches_per_s:
            return 0.0
        return (max(self.block_rates) - min(self.block_rates)) / self.batches_per_s

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(
            batches_per_s=self.batches_per_s,
            gb_per_s=self.gb_per_s,
            us_per_batch=self.us_per_batch,
            spread=self.spread,
        )
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Result:
        d = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        d["consumer"] = Side(**d.get("consumer", {}))
        d["producers"] = Side(**d.get("producers", {}))
        return cls(**d)


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _per_batch(delta: procstat.Counters, perf: dict[str, int] | None, n: int) -> Side:
    n = max(1, n)
    side = Side(1e6 * delta.cpu_s / n, delta.minflt / n, delta.csw / n)
    if perf is not None:
        side.syscalls = perf.get("raw_syscalls:sys_enter", 0) / n
        side.futex = perf.get("syscalls:sys_enter_futex", 0) / n
        # perf sees every fault of the window exactly; /proc is the fallback.
        side.minflt = perf.get("page-faults", delta.minflt) / n
    return side


class Meter:
    """A started case in this process: warm-up, timed blocks of batches and
    the counters around them. run() drives it for the CLI; benchmarks/
    drives it under pytest-benchmark."""

    def __init__(
        self, feed: Feed, case: Case, options: Options, result: Result
    ) -> None:
        self.it = feed.batches
        self.feed = feed
        self.case = case
        self.options = options
        self.result = result
        self.batch: Any = None  # held, as a `for` loop's variable would be
        self.latencies: list[int] = []
        self._perfs: list[procstat.PerfStat] = []
        self._producers: list[int] = []
        self._c0 = self._p0 = procstat.Counters()
        self._counted = 0

    def first(self, t_open: float) -> None:
        self.batch = next(self.it)
        read_stamp(first_leaf(self.batch))
        self.result.first_batch_s = time.perf_counter() - t_open

    def warm_up(self, budget: Budget) -> int:
        """Consumes for budget.warmup_s (at least 3 batches); returns the
        batches per block that make budget.blocks blocks last budget.seconds."""
        step = self.options.consumer_step_s
        n = 0
        t0 = time.perf_counter()
        while n < 3 or time.perf_counter() - t0 < budget.warmup_s:
            self.batch = next(self.it)
            read_stamp(first_leaf(self.batch))
            _busy(step)
            n += 1
        rate = n / (time.perf_counter() - t0)
        return max(1, round(rate * budget.seconds / max(1, budget.blocks)))

    def block(self, k: int) -> float:
        """Takes k batches (reading each one's stamp); returns the seconds."""
        it, step = self.it, self.options.consumer_step_s
        pace = self.case.pace_s > 0
        t = time.perf_counter()
        for _ in range(k):
            self.batch = next(it)
            _, sent = read_stamp(first_leaf(self.batch))
            if pace:
                self.latencies.append(time.perf_counter_ns() - sent)
            if step:
                _busy(step)
        dt = time.perf_counter() - t
        self.result.block_rates.append(k / dt)
        self.result.batches += k
        self.result.seconds += dt
        return dt

    def drain(self, budget: Budget, rate: float) -> None:
        """Rounds of: let the producers fill every slot (nothing is taken
        meanwhile), then time each next() alone while the batches last.
        Each call finds its batch waiting, so its time is the consumer's
        own cost of a batch; `rate` (batches/s, free-running) sizes the
        pause."""
        it = self.it
        ahead = max(1, self.case.slots - 1)
        fill_s = min(0.5, 2.0 * ahead / max(rate, 1.0) + 0.002)
        times: list[int] = []
        t_end = time.perf_counter() + budget.seconds
        clock = time.perf_counter_ns
        while time.perf_counter() < t_end or len(times) < 100:
            time.sleep(fill_s)
            for _ in range(ahead):
                t = clock()
                self.batch = next(it)
                times.append(clock() - t)
            read_stamp(first_leaf(self.batch))
        times.sort()
        q = len(times)
        self.result.next_us = {
            "p50": times[q // 2] / 1e3,
            "p90": times[min(q - 1, q * 9 // 10)] / 1e3,
            "calls": float(q),
        }
        self.result.batches += q

    def start_counting(self) -> None:
        me = os.getpid()
        self._producers = procstat.children_of(me)
        if self.options.perf and procstat.perf_available():
            self._perfs = [procstat.PerfStat([me])]
            if self._producers:
                self._perfs.append(procstat.PerfStat(self._producers))
            for p in self._perfs:
                p.enable()
        self._counted = self.result.batches
        self._c0 = procstat.self_counters()
        self._p0 = procstat.tree_counters(self._producers)

    def stop_counting(self) -> Result:
        """Per-batch counters since start_counting, PSS now (steady state:
        every batch in flight), latency percentiles, ring occupancy."""
        n = self.result.batches - self._counted
        counts: list[dict[str, int] | None] = [None, None]
        for p in self._perfs:
            p.disable()
        for i, p in enumerate(self._perfs):
            counts[i] = p.close()
        c1 = procstat.self_counters()
        p1 = procstat.tree_counters(self._producers)
        r = self.result
        r.pss_bytes = procstat.total_pss(os.getpid())
        r.consumer = _per_batch(c1 - self._c0, counts[0], n)
        r.producers = _per_batch(p1 - self._p0, counts[1], n)
        if self.latencies:
            lat = sorted(self.latencies)
            q = len(lat)
            r.latency_us = {
                "p50": lat[q // 2] / 1e3,
                "p90": lat[min(q - 1, q * 9 // 10)] / 1e3,
                "p99": lat[min(q - 1, q * 99 // 100)] / 1e3,
                "max": lat[-1] / 1e3,
            }
        if self.feed.stats is not None:
            stats = self.feed.stats()
            r.mean_ready = stats.get("mean_ready")
            r.autotune = stats.get("autotune")
        return r


@contextmanager
def started(case: Case, options: Options | None = None) -> Iterator[Meter]:
    """Opens the case's transport and takes the first batch (timed from the
    transport's construction, its imports excluded); closes it on exit."""
    options = options or Options()
    transport = TRANSPORTS[case.transport]
    result = Result(asdict(case), transport.label, case.shape.batch_bytes)
    opener = transport.resolve()  # imports happen before the clock starts
    gc.collect()
    t_open = time.perf_counter()
    with opener(case) as feed:
        meter = Meter(feed, case, options, result)
        meter.first(t_open)
        result.notes += feed.notes
        if options.note:
            result.notes.append(options.note)
        try:
            yield meter
        finally:
            meter.batch = None


def run(case: Case, budget: Budget, options: Options | None = None) -> Result:
    """Measures one case in this process: first batch, warm-up, blocks."""
    options = options or Options()
    transport = TRANSPORTS[case.transport]
    missing = transport.missing()
    if missing:
        result = Result(asdict(case), transport.label, case.shape.batch_bytes)
        result.error = missing
        return result
    with started(case, options) as meter:
        if options.first_only:
            return meter.result
        per_block = meter.warm_up(budget)
        if options.drain:
            meter.block(per_block)
            meter.drain(budget, meter.result.batches_per_s)
            return meter.result
        meter.start_counting()
        for _ in range(max(1, budget.blocks)):
            meter.block(per_block)
        return meter.stop_counting()
