"""One case, measured in this process: time to the first batch, warm-up,
then timed blocks of batches (the median block is the steady-state rate),
with both sides' CPU time, page faults and, optionally, system calls."""

from __future__ import annotations

import gc
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from . import procstat
from .transports import TRANSPORTS, Case, first_leaf
from .workloads import read_stamp


@dataclass
class Budget:
    seconds: float = 3.0    # measured seconds per case, after warm-up
    warmup_s: float = 0.5   # warm-up: at least this long and 3 batches
    blocks: int = 5         # the median of this many timed blocks is reported


@dataclass
class Options:
    perf: bool = False          # count system calls with `perf stat`
    consumer_step_s: float = 0  # busy work per batch in the consumer


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
    mean_ready: float | None = None
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
        d.update(batches_per_s=self.batches_per_s, gb_per_s=self.gb_per_s,
                 us_per_batch=self.us_per_batch, spread=self.spread)
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


def _per_batch(delta: procstat.Counters, perf: dict[str, int] | None,
               n: int) -> Side:
    side = Side(1e6 * delta.cpu_s / n, delta.minflt / n, delta.csw / n)
    if perf is not None:
        side.syscalls = perf.get("raw_syscalls:sys_enter", 0) / n
        side.futex = perf.get("syscalls:sys_enter_futex", 0) / n
        # perf sees every fault of the window exactly; /proc is the fallback.
        side.minflt = perf.get("page-faults", delta.minflt) / n
    return side


def run(case: Case, budget: Budget, options: Options | None = None) -> Result:
    """Opens the case's transport, measures it, closes it."""
    options = options or Options()
    transport = TRANSPORTS[case.transport]
    result = Result(asdict(case), transport.label, case.shape.batch_bytes)
    missing = transport.missing()
    if missing:
        result.error = missing
        return result
    opener = transport.resolve()  # imports happen before the clock starts
    gc.collect()
    t_open = time.perf_counter()
    with opener(case) as feed:
        it = feed.batches
        batch = next(it)
        read_stamp(first_leaf(batch))
        result.first_batch_s = time.perf_counter() - t_open
        result.notes += feed.notes
        _measure(it, batch, case, budget, options, result)
        if feed.stats is not None:
            result.mean_ready = feed.stats().get("mean_ready")
        del batch
    return result


def _measure(it: Any, batch: Any, case: Case, budget: Budget, options: Options,
             result: Result) -> None:
    step = options.consumer_step_s
    # Warm-up: the first batches pay for caches, page faults, JITs of all
    # kinds; its rate sizes the timed blocks.
    n = 0
    t0 = time.perf_counter()
    while n < 3 or time.perf_counter() - t0 < budget.warmup_s:
        batch = next(it)
        read_stamp(first_leaf(batch))
        _busy(step)
        n += 1
    rate = n / (time.perf_counter() - t0)
    per_block = max(1, round(rate * budget.seconds / max(1, budget.blocks)))

    me = os.getpid()
    producers = procstat.children_of(me)
    perfs: list[procstat.PerfStat] = []
    if options.perf and procstat.perf_available():
        perfs = [procstat.PerfStat([me])]
        if producers:
            perfs.append(procstat.PerfStat(producers))
        for p in perfs:
            p.enable()
    c0 = procstat.self_counters()
    p0 = procstat.tree_counters(producers)
    latencies: list[int] = []
    pace = case.pace_s > 0
    total = 0
    t_start = time.perf_counter()
    for _ in range(max(1, budget.blocks)):
        t = time.perf_counter()
        for _ in range(per_block):
            batch = next(it)
            _, sent = read_stamp(first_leaf(batch))
            if pace:
                latencies.append(time.perf_counter_ns() - sent)
            if step:
                _busy(step)
        result.block_rates.append(per_block / (time.perf_counter() - t))
        total += per_block
    result.seconds = time.perf_counter() - t_start
    result.batches = total
    counts: list[dict[str, int] | None] = [None, None]
    for p in perfs:
        p.disable()
    for i, p in enumerate(perfs):
        counts[i] = p.close()
    c1 = procstat.self_counters()
    p1 = procstat.tree_counters(producers)
    result.pss_bytes = procstat.total_pss(me)  # steady state: all in flight
    result.consumer = _per_batch(c1 - c0, counts[0], total)
    result.producers = _per_batch(p1 - p0, counts[1], total)
    if latencies:
        latencies.sort()
        q = len(latencies)
        result.latency_us = {
            "p50": latencies[q // 2] / 1e3,
            "p90": latencies[min(q - 1, q * 9 // 10)] / 1e3,
            "p99": latencies[min(q - 1, q * 99 // 100)] / 1e3,
            "max": latencies[-1] / 1e3,
        }
