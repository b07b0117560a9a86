"""Stress: many Prefetchers, random shapes of use, random worker kills.
Zero corrupted, lost or duplicated batches; every kill detected; nothing
leaked. The default run has a short form; FASTQ_SLOW_TESTS=1 the long one.
Set FASTQ_STRESS_REPORT=path to get the figures as JSON."""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import time
from typing import Any

import pytest
from helpers import ChecksumDataset, checksum_ok

import fastq


def one_run(rng: random.Random, totals: dict[str, Any]) -> None:
    workers = rng.randint(1, 4)
    slots = rng.randint(1, 6)
    ordered = rng.random() < 0.7
    method = rng.choice(["fork", "forkserver"])
    n = rng.randint(50, 3000)
    bs = rng.randint(1, 16)
    kill_at = rng.randint(1, 200) if rng.random() < 0.25 else None
    killed_at: float | None = None
    pf = fastq.Prefetcher(
        ChecksumDataset(n),
        batch_size=bs,
        workers=workers,
        slots=slots,
        ordered=ordered,
        shuffle=rng.random() < 0.5,
        seed=rng.randint(0, 1 << 30),
        start_method=method,
    )
    held: list[tuple[Any, ...]] = []
    consumed = 0
    with pf:
        try:
            for _epoch in range(rng.randint(1, 3)):
                seen = []
                for batch in pf:
                    consumed += 1
                    if not checksum_ok(batch):
                        totals["corrupted"] += 1
                    seen.extend(batch[1].tolist())
                    if rng.random() < 0.2 and len(held) < slots - 1:
                        held.append(batch)
                    elif held and rng.random() < 0.3:
                        old = held.pop(rng.randrange(len(held)))
                        if not checksum_ok(old):  # a held batch never changes
                            totals["corrupted"] += 1
                        del old  # releases its slot
                    if kill_at is not None and consumed == kill_at:
                        victim = rng.choice(pf._pool.pids)
                        os.kill(victim, signal.SIGKILL)
                        totals["faults"] += 1
                        kill_at = None
                        killed_at = time.monotonic()
                if sorted(seen) != list(range(n)):  # every index exactly once
                    totals["lost_or_duplicated"] += 1
            if killed_at is not None:
                # The kill came after the last batch this run needed from
                # that worker, so nothing waited on it: the data was whole.
                # The promise is then that any fetch a second after a death
                # reports it.
                time.sleep(max(0.0, killed_at + 1.0 - time.monotonic()))
                try:
                    next(iter(pf))
                    totals["undetected"] += 1
                except fastq.WorkerDied:
                    totals["detected_at_next_fetch"] += 1
        except fastq.WorkerDied:
            assert killed_at is not None
            totals["detect_s"].append(time.monotonic() - killed_at)
    totals["batches"] += consumed
    totals["runs"] += 1
    del held


def stress(batches: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    totals: dict[str, Any] = {
        "runs": 0,
        "batches": 0,
        "corrupted": 0,
        "lost_or_duplicated": 0,
        "faults": 0,
        "undetected": 0,
        "detected_at_next_fetch": 0,
        "detect_s": [],
    }
    while totals["batches"] < batches:
        one_run(rng, totals)
    detect = totals.pop("detect_s")
    totals["detected_while_waiting"] = len(detect)
    if detect:
        totals["detect_median_s"] = statistics.median(detect)
        totals["detect_max_s"] = max(detect)
    report = os.environ.get("FASTQ_STRESS_REPORT")
    if report:
        with open(report, "w") as f:
            json.dump(totals, f, indent=2)
    print(totals)
    return totals


def check(totals: dict[str, Any]) -> None:
    assert totals["corrupted"] == 0
    assert totals["lost_or_duplicated"] == 0
    # every kill became WorkerDied: while the consumer waited, or at its
    # next fetch when no batch it still needed depended on the dead worker
    assert totals["undetected"] == 0
    detected = totals["detected_while_waiting"] + totals["detected_at_next_fetch"]
    assert detected == totals["faults"]
    if totals["faults"]:
        assert totals["detect_max_s"] < 1.0


@pytest.mark.timeout(300)
def test_stress_short() -> None:
    check(stress(batches=20_000, seed=1))


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_stress_long() -> None:
    check(stress(batches=int(os.environ.get("FASTQ_STRESS_BATCHES", "300000")), seed=2))
