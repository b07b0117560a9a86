"""Fixtures that check the world after every test: no child process left,
no ring mapping or descriptor left, nothing in /dev/shm."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # helpers.py for spawn children

START_METHODS = [
    m for m in ("fork", "forkserver", "spawn") if m in mp.get_all_start_methods()
]

# spawn starts a fresh interpreter for every worker, which makes it the long
# route of each test run under every start method: the fixtures below run it
# in the long form only (FASTQ_SLOW_TESTS=1). The default run still spawns
# where spawn itself is the point (tests that name it in their parameters).
ROUTES = [
    pytest.param(m, marks=pytest.mark.slow) if m == "spawn" else m
    for m in START_METHODS
]


def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> None:
    if os.environ.get("FASTQ_SLOW_TESTS") == "1":
        return
    skip = pytest.mark.skip(reason="slow: set FASTQ_SLOW_TESTS=1 to run")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def ring_mappings() -> list[str]:
    """This process's mappings and descriptors of fastq rings."""
    found = []
    with open("/proc/self/maps") as f:
        found += [line.strip() for line in f if "fastq-" in line]
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if "fastq-" in target:
            found.append(f"fd {fd} -> {target}")
    return found


def child_pids() -> list[int]:
    """Live children of this process, other than multiprocessing's own
    helpers (the fork server and the resource tracker)."""
    me = os.getpid()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        ppid = int(fields[1])  # zombies count: a leak is a child not reaped
        if ppid != me:
            continue
        if b"forkserver" in cmd or b"resource_tracker" in cmd:
            continue
        out.append(int(entry))
    return out


@pytest.fixture(autouse=True)
def clean_world() -> Iterator[None]:
    """Fails a test that leaves a worker, a ring mapping or a /dev/shm name."""
    # fastq's memory is memfd and makes no /dev/shm name, so a fastq name
    # there is a leak, whichever process made it.
    before_shm = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    yield
    gc.collect()
    deadline = time.monotonic() + 3.0
    while child_pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert child_pids() == [], f"processes left behind: {child_pids()}"
    assert ring_mappings() == [], f"ring memory left mapped: {ring_mappings()}"
    if os.path.isdir("/dev/shm"):
        new = set(os.listdir("/dev/shm")) - before_shm
        assert not [n for n in new if "fastq" in n], f"/dev/shm leak: {new}"
    # Everything alive now has just been found clean. Frozen, it is left out
    # of the next test's collection, which then walks that test's objects
    # only, not the few hundred thousand of the modules loaded (torch's
    # among them): 0.1 s a test otherwise.
    gc.freeze()


@pytest.fixture(params=ROUTES)
def start_method(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=[*ROUTES, "thread"])
def started_by(request: pytest.FixtureRequest) -> dict[str, str]:
    """How workers start, as Prefetcher arguments: processes by each start
    method, or threads."""
    if request.param == "thread":
        return {"worker_method": "thread"}
    return {"start_method": str(request.param)}


@pytest.fixture
def worker0_late(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Stops worker 0 (a process) for half a second as the ring is handed
    to the workers, so that the others reach it first: the schedule in
    which a batch worker 0 made before the ring existed could be made
    again by another worker, or wait for a slot later batches took."""
    import signal
    import threading

    from fastq._workers._pool import WorkerPool

    send_region = WorkerPool.send_region
    timers: list[threading.Timer] = []

    def late(self: WorkerPool, *args: Any, **kwargs: Any) -> None:
        pid = self.pids[0]
        os.kill(pid, signal.SIGSTOP)
        timer = threading.Timer(0.5, os.kill, (pid, signal.SIGCONT))
        timer.start()
        timers.append(timer)
        send_region(self, *args, **kwargs)

    monkeypatch.setattr(WorkerPool, "send_region", late)
    yield
    for timer in timers:
        timer.join()
