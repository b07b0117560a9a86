"""Fixtures that check the world after every test: no child process left,
no ring mapping or descriptor left, nothing in /dev/shm."""

from __future__ import annotations

import gc
import os
import signal
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # helpers.py for spawn children

from process_checks import START_METHODS, child_pids, ring_mappings

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


@pytest.fixture(autouse=True)
def sigint_raises() -> Iterator[None]:
    """Every test runs with Python's own Ctrl+C handler, whatever the run
    was started with: a run started in the background (`cmd &`, nohup)
    inherits SIGINT ignored, and the tests that send SIGINT, to this
    process or to a victim it starts (a handler, unlike an ignored signal,
    does not survive exec), would see nothing arrive."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


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
