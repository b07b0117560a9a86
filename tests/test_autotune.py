"""workers="auto": the policy's decisions from measured windows, and the
parking it drives: parked workers take no slot and no task, so every
batch still arrives once and in order, and nothing is left behind."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import numpy as np
import pytest
from helpers import PatternDataset, SlowDataset, expected_batch

import fastq
import fastq._faces._prefetcher
from fastq._loop._autotune import GAIN, HOLD_WINDOWS, SURPLUS_WINDOWS, Policy, Window


def window(
    *,
    rate: float = 10.0,
    consumer_wait: float = 0.0,
    idle_cpus: float = 0.0,
    worker_busy: float = 1.0,
    worker_wait: float = 0.0,
) -> Window:
    return Window(
        seconds=1.0,
        batches=int(rate),
        made=int(rate),
        consumer_wait=consumer_wait,
        worker_busy=worker_busy,
        worker_wait=worker_wait,
        idle_cpus=idle_cpus,
    )


def settle(p: Policy) -> None:
    """The window after a change is not judged."""
    assert p.decide(window(rate=50)) is None


# ------------------------------------------------------------------ policy


def test_a_starved_consumer_with_idle_cpus_gets_workers_in_proportion() -> None:
    p = Policy(pool=16)
    # Waiting 75% of the time: one worker makes a quarter of what the loop
    # takes, so three more are wanted, and four CPUs are idle.
    got = p.decide(window(rate=10, consumer_wait=0.75, idle_cpus=4.0))
    assert got is not None and got[0] == 4
    assert "75%" in got[1] and "1 -> 4 workers" in got[1]


def test_growth_stops_at_the_idle_cpus_and_the_pool() -> None:
    p = Policy(pool=16)
    got = p.decide(window(consumer_wait=0.95, idle_cpus=2.0))
    # Two idle CPUs, and the waiting consumer's own CPU: three more at most.
    assert got is not None and got[0] == 4
    p = Policy(pool=3)
    got = p.decide(window(consumer_wait=0.95, idle_cpus=60.0))
    assert got is not None and got[0] == 3
    settle(p)
    p.decide(window(rate=30))  # judged: kept
    assert p.decide(window(rate=30, consumer_wait=0.9, idle_cpus=60.0)) is None
    assert p.active == 3


def test_no_spare_cpu_means_no_more_workers() -> None:
    p = Policy(pool=8)
    assert p.decide(window(consumer_wait=0.3, idle_cpus=0.1)) is None
    assert p.active == 1
    assert "no CPU is idle" in p.reason


def test_a_change_that_delivers_nothing_more_is_undone_and_held() -> None:
    p = Policy(pool=8)
    assert p.decide(window(rate=10, consumer_wait=0.5, idle_cpus=4)) is not None
    assert p.active == 2
    settle(p)
    got = p.decide(window(rate=10 * GAIN * 0.99, consumer_wait=0.5, idle_cpus=4))
    assert got is not None and got[0] == 1
    assert "back to 1" in got[1] and "limit is elsewhere" in got[1]
    settle(p)
    # Held: the same starved windows change nothing for a while.
    for _ in range(HOLD_WINDOWS - 1):
        assert p.decide(window(rate=10, consumer_wait=0.5, idle_cpus=4)) is None
    assert p.active == 1
    assert p.decide(window(rate=10, consumer_wait=0.5, idle_cpus=4)) is not None


def test_a_change_that_delivers_more_is_kept_and_said() -> None:
    p = Policy(pool=8)
    p.decide(window(rate=10, consumer_wait=0.5, idle_cpus=4))
    settle(p)
    assert p.decide(window(rate=19, consumer_wait=0.01)) is None
    assert p.active == 2
    assert "kept: 10.0 -> 19.0 batches/s" in p.reason
    assert [a for a, _ in p.events] == [1, 2, 2]


def test_workers_the_loop_does_not_need_are_parked_after_a_while() -> None:
    p = Policy(pool=8, active=8)
    # The loop never waits; the workers wait for free slots 80% of the
    # time and make 1.2 CPUs' worth: 2 workers (with headroom) are enough.
    surplus = window(consumer_wait=0.0, worker_wait=0.8, worker_busy=1.2)
    for _ in range(SURPLUS_WINDOWS - 1):
        assert p.decide(surplus) is None
    got = p.decide(surplus)
    assert got is not None and got[0] == 2
    assert "8 -> 2 workers" in got[1]


def test_a_surplus_must_last_before_parking() -> None:
    p = Policy(pool=8, active=8)
    surplus = window(consumer_wait=0.0, worker_wait=0.8, worker_busy=1.2)
    for _ in range(3 * SURPLUS_WINDOWS):
        assert p.decide(surplus) is None or p.active < 8
        if p.active < 8:
            break
        assert p.decide(window(consumer_wait=0.0, worker_wait=0.1)) is None
    assert p.active == 8


def test_windows_with_too_few_batches_decide_nothing() -> None:
    p = Policy(pool=8)
    quiet = Window(
        1.0, 1, 1, consumer_wait=0.9, worker_busy=0, worker_wait=0, idle_cpus=8
    )
    assert p.decide(quiet) is None
    assert p.active == 1


# -------------------------------------------------------------- prefetcher


def test_parked_workers_take_no_batch_and_order_holds(
    started_by: dict[str, str],
) -> None:
    """The mechanism alone: with workers 1 and 2 parked, worker 0 makes
    every batch; unparked, they make batches again; every batch once, in
    order, throughout."""
    n, rows = 48, 4
    with fastq.Prefetcher(
        SlowDataset(n, 0.002), batch_size=rows, workers=3, **started_by
    ) as pf:

        def made() -> list[int]:
            return [w["batches"] for w in pf.stats()["workers"]]

        def epoch() -> None:
            assert [int(i) for b in pf for i in b[1]] == list(range(n))

        pf._ring.set_active(1)
        # A batch a worker was making when parked is finished and kept.
        before = made()
        epoch()
        epoch()
        parked = made()
        assert parked[1] - before[1] <= 1 and parked[2] - before[2] <= 1
        epoch()
        assert made()[1:] == parked[1:]
        pf._ring.set_active(3)
        for _ in range(200):  # until a started worker has had its turn
            epoch()
            if made()[1:] != parked[1:]:
                break
        else:
            pytest.fail(f"unparked workers made nothing: {made()}")


def test_auto_runs_every_batch_once_in_order_and_reports() -> None:
    n, rows = 64, 4
    with fastq.Prefetcher(PatternDataset(n), batch_size=rows, workers="auto") as pf:
        for _ in range(2):
            k = -1
            for k, b in enumerate(pf):
                want = expected_batch(np.arange(k * rows, (k + 1) * rows))
                for got, exp in zip(b, want):
                    assert np.array_equal(got, exp)
            assert k + 1 == n // rows
        tune = pf.stats()["autotune"]
    assert tune["pool"] == pf.workers == fastq._faces._prefetcher._cpus_per_rank()
    assert 1 <= tune["workers"] <= tune["pool"]
    assert tune["decisions"][0]["why"] == f"started with 1 of {tune['pool']} workers"


def test_a_starved_loop_gets_more_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers that sleep (I/O-bound) leave the CPUs idle while the loop
    waits: auto unparks more of them, and says why."""
    monkeypatch.setattr(fastq._faces._prefetcher, "cpu_budget", lambda: 4)
    with fastq.Prefetcher(
        SlowDataset(10_000, 0.004), batch_size=2, workers="auto", ordered=False
    ) as pf:
        assert pf.workers == 4
        seen = 0
        tune = None
        for batch in pf:
            seen += len(batch[1])
            if seen % 64:
                continue  # the loop must stay cheaper than the workers
            tune = pf.stats()["autotune"]
            if tune["workers"] > 1 and "kept" in tune["why"]:
                break
        else:
            pytest.fail(f"never grew: {tune}")
    grew = tune["decisions"][1]
    assert grew["workers"] > 1 and "the consumer waited" in grew["why"]


def test_a_fixed_count_reports_no_autotune() -> None:
    with fastq.Prefetcher(PatternDataset(8), batch_size=4, workers=1) as pf:
        next(iter(pf))
        assert pf.stats()["autotune"] is None


def test_a_parked_worker_that_dies_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fastq._faces._prefetcher, "cpu_budget", lambda: 3)
    pf = fastq.Prefetcher(PatternDataset(400), batch_size=4, workers="auto")
    try:
        next(iter(pf))
        os.kill(pf._pool.pids[2], signal.SIGKILL)
        with pytest.raises(fastq.WorkerDied) as info:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                for _ in pf:
                    pass
        assert "worker 2" in str(info.value)
    finally:
        pf.close()


def test_close_with_parked_workers_leaves_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fastq._faces._prefetcher, "cpu_budget", lambda: 4)
    pf = fastq.Prefetcher(PatternDataset(64), batch_size=4, workers="auto")
    next(iter(pf))
    pids = list(pf._pool.pids)
    pf.close()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.parametrize(
    ("workers", "match"),
    [
        ("many", r"workers='many': expected a positive integer or \"auto\""),
        ("Auto", r"workers='Auto'"),
    ],
)
def test_other_words_for_workers_are_refused(workers: Any, match: str) -> None:
    with pytest.raises(fastq.ConfigError, match=match):
        fastq.Prefetcher(PatternDataset(8), batch_size=4, workers=workers)


def gen() -> Any:
    yield np.zeros(3)


def test_auto_is_refused_for_a_stream_source_with_the_fix() -> None:
    with pytest.raises(fastq.ConfigError, match=r"choose workers=N.*map-style"):
        fastq.Prefetcher(gen, workers="auto")
