"""Faults injected for real, in subprocesses where the victim is the
consumer: the world is checked afterwards (no process, no ring memory)."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any, Callable

import numpy as np
import pytest
from helpers import CountingBatches, PatternDataset, StuckDataset, alive

import fastq

VICTIM = os.path.join(os.path.dirname(__file__), "victim.py")


def maps_ring(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/maps") as f:
            return "/memfd:fastq-ring" in f.read()
    except OSError:
        return False


def wait_gone(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids):
            return []
        time.sleep(0.01)
    return [p for p in pids if alive(p)]


@pytest.fixture
def start_victim() -> Iterator[
    Callable[[str, str], tuple[subprocess.Popen[str], dict[str, Any]]]
]:
    """Starts victim.py in its own session; kills whatever is left of it."""
    started: list[tuple[subprocess.Popen[str], list[int]]] = []

    def start(
        scenario: str, method: str
    ) -> tuple[subprocess.Popen[str], dict[str, Any]]:
        proc = subprocess.Popen(
            [sys.executable, VICTIM, scenario, method],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        started.append((proc, []))
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 20)
        line = proc.stdout.readline() if ready else ""
        if not line:
            proc.kill()
            raise AssertionError(f"victim did not start: {proc.communicate()[1]}")
        pids = json.loads(line)
        started[-1][1].extend(pids["workers"] + pids["others"])
        return proc, pids

    yield start
    for proc, pids in started:
        for pid in [proc.pid, *pids]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        proc.communicate()


@pytest.mark.timeout(60)
def test_killed_consumer_takes_every_worker_with_it(
    start_victim, start_method: str
) -> None:  # type: ignore[no-untyped-def]
    proc, pids = start_victim("killed-consumer", start_method)
    workers = pids["workers"]
    assert all(alive(p) and maps_ring(p) for p in workers)
    t0 = time.monotonic()
    proc.kill()
    proc.wait()
    left = wait_gone(workers + pids["others"], 1.0)
    assert left == [], f"still alive {time.monotonic() - t0:.2f}s after SIGKILL: {left}"
    assert not any(maps_ring(p) for p in workers)


# Ctrl+C while waiting takes a victim's whole start and shutdown: fork's run
# is the default, forkserver's and spawn's the long form.
CTRL_C = [
    pytest.param(m, s, marks=pytest.mark.slow)
    if m == "spawn" or (m == "forkserver" and s == "sigint-waiting")
    else (m, s)
    for m in ("fork", "forkserver", "spawn")  # Linux has all three
    for s in ("sigint-waiting", "sigint-in-body")
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("start_method", "scenario"), CTRL_C)
def test_ctrl_c_gives_one_keyboard_interrupt(
    start_victim,
    start_method: str,  # type: ignore[no-untyped-def]
    scenario: str,
) -> None:
    proc, pids = start_victim(scenario, start_method)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().strip() in ("waiting", "in body")
    time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGINT)  # the terminal's Ctrl+C: the whole group
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 130, err
    assert out.count("KeyboardInterrupt caught once") == 1
    assert "Traceback" not in err, err  # no worker printed anything
    assert wait_gone(pids["workers"], 1.0) == []


@pytest.mark.timeout(60)
def test_ctrl_c_during_close_still_reaps_every_worker(
    start_victim,  # type: ignore[no-untyped-def]
) -> None:
    """A second Ctrl+C while close() waits for workers stuck in user code:
    close skips the rest of its grace, kills and reaps them, then lets the
    interrupt go on. A notebook's kernel lives on with nothing left over."""
    proc, pids = start_victim("sigint-in-close", "forkserver")
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "closing"
    time.sleep(0.15)  # inside close's half-second grace
    os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 130, out + err
    left = json.loads(out.splitlines()[0])["left_after_interrupted_close"]
    assert left == [], f"workers left after an interrupted close: {left}"
    assert wait_gone(pids["workers"], 1.0) == []


@pytest.mark.timeout(30)
def test_stuck_worker_gives_fetch_timeout_with_its_stack() -> None:
    with fastq.Prefetcher(
        StuckDataset(100, stuck=9),
        batch_size=4,
        workers=2,
        timeout=1.0,
        start_method="forkserver",
    ) as pf:
        t0 = time.monotonic()
        got = 0
        with pytest.raises(fastq.FetchTimeout) as info:
            for _ in pf:
                got += 1
                t0 = time.monotonic()
        waited = time.monotonic() - t0
    assert got == 2 and 1.0 <= waited < 2.0
    err = info.value
    assert isinstance(err, TimeoutError) and err.task == 2 and err.worker in (0, 1)
    assert f"worker {err.worker}" in str(err) and "batch 2" in str(err)
    assert "in __getitem__" in str(err)  # the stuck worker's stack


@pytest.mark.timeout(60)
def test_close_is_bounded_with_16_workers_in_every_state() -> None:
    # Workers stuck in user code (two samples hang), others producing
    # slowly, others waiting for a free slot.
    pf = fastq.Prefetcher(
        StuckDataset(10_000, stuck=5),
        batch_size=4,
        workers=16,
        slots=4,
        start_method="forkserver",
    )
    it = iter(pf)
    time.sleep(1.0)
    pids = pf._pool.pids
    t0 = time.monotonic()
    pf.close()
    elapsed = time.monotonic() - t0
    assert elapsed < 2.5, f"close took {elapsed:.2f}s"
    assert wait_gone(pids, 0.1) == []
    del it


@pytest.mark.timeout(30)
def test_worker_killed_while_waiting_for_a_free_slot() -> None:
    with fastq.Prefetcher(
        PatternDataset(1000),
        batch_size=2,
        workers=2,
        slots=2,
        start_method="forkserver",
    ) as pf:
        it = iter(pf)
        next(it)
        time.sleep(0.3)  # the ring fills; workers wait on FREE
        victim = pf._pool.pids[1]
        os.kill(victim, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(fastq.WorkerDied, match=f"pid {victim}.*SIGKILL"):
            for _ in it:
                pass
        assert time.monotonic() - t0 < 1.0


class Segfaulting(PatternDataset):
    def __getitem__(self, i: int) -> tuple[Any, ...]:
        if i == 7:
            import ctypes

            ctypes.string_at(0)  # a real segmentation fault in native code
        return super().__getitem__(i)


@pytest.mark.timeout(30)
def test_segfault_in_native_code(capfd: pytest.CaptureFixture[str]) -> None:
    with fastq.Prefetcher(
        Segfaulting(100), batch_size=4, workers=2, start_method="fork"
    ) as pf:
        with pytest.raises(fastq.WorkerDied, match="SIGSEGV.*batch 1"):
            list(x[1].copy() for x in pf)
    capfd.readouterr()


class Generator:
    def __call__(self):  # type: ignore[no-untyped-def]
        yield np.zeros((2, 2))
        if fastq.get_worker_info() is not None:
            raise OSError("disk went away")


@pytest.mark.timeout(30)
def test_exception_in_a_generator() -> None:
    with fastq.Prefetcher(Generator(), workers=2, start_method="fork") as pf:
        with pytest.raises(fastq.WorkerError, match="OSError.*disk went away"):
            list(pf)


@pytest.mark.timeout(30)
def test_not_enough_memory_is_a_clear_error_at_construction() -> None:
    # 1 MiB samples x 200k rows = 200 GiB: more than any test machine has.
    spec = {"x": ((1 << 20,), "uint8")}
    with pytest.raises(
        fastq.SharedMemoryError,
        match=r"needs .*GiB \(\d+ bytes\) .* available.*slots= or batch_size=",
    ):
        fastq.Prefetcher(
            PatternDataset(10),
            batch_size=200_000,
            spec=spec,
            workers=1,
            start_method="fork",
        )


def _reservation_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ring's memory is taken by another process between the
    constructor's check and the settling thread's fallocate."""
    import errno

    from fastq._core import _shm

    def no_memory(fd: int, size: int, name: str, *args: Any) -> None:
        raise fastq.SharedMemoryError(
            _shm.not_enough_memory(size, 0, OSError(errno.ENOSPC, "No space left"))
        )

    monkeypatch.setattr(_shm, "reserve", no_memory)


@pytest.mark.timeout(30)
def test_a_region_reports_a_reservation_its_thread_could_not_make(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Told once, to whoever asks, before or after it was found."""
    from fastq._core import _shm

    _reservation_fails(monkeypatch)
    region = _shm.Region.create(8 * _shm.huge_page_size())
    try:
        assert region.wait_settled(10)
        assert isinstance(region.failure, fastq.SharedMemoryError)
        told: list[BaseException] = []
        region.on_failure(told.append)
        assert told == [region.failure]
    finally:
        region.close()


class _RefusingMapping:
    """A mapping whose MADV_POPULATE_WRITE fails with `errno_`, as the
    kernel's does out of memory (ENOMEM) or before Linux 5.14 (EINVAL)."""

    def __init__(self, errno_: int) -> None:
        self.errno = errno_

    def madvise(self, *args: Any) -> None:
        raise OSError(self.errno, os.strerror(self.errno))


@pytest.mark.timeout(30)
def test_a_reservation_through_an_advised_mapping_reports_a_shortage_or_falls_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where shmem_enabled says advise, the thread allocates the pages by
    populating the mapping: ENOMEM there is the shortage; a kernel that
    cannot populate has the file reserved instead, in base pages."""
    import errno

    from fastq._core import _shm

    size = 2 * _shm.huge_page_size()
    short = _shm.Region(-1, size, _RefusingMapping(errno.ENOMEM), _shm.PAGES_THP)
    told: list[BaseException] = []
    short.on_failure(told.append)
    assert not short._reserve_pages(-1, "fastq-ring", True)
    assert told == [short.failure]
    assert "Cannot allocate memory" in str(short.failure)

    reserved: list[tuple[int, int]] = []
    monkeypatch.setattr(
        _shm,
        "reserve",
        lambda fd, size, name, start, length: reserved.append((start, length)),
    )
    old = _shm.Region(-1, size, _RefusingMapping(errno.EINVAL), _shm.PAGES_THP)
    assert old._reserve_pages(-1, "fastq-ring", True)
    assert old.failure is None and old.pages == _shm.PAGES_BASE
    assert reserved == [(0, size)]


@pytest.mark.timeout(30)
def test_memory_gone_after_construction_ends_the_run_with_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A ring of several huge pages is reserved by a thread after it is
    handed over; a shortage found there ends the run at its next batch with
    SharedMemoryError naming the bytes and the fix: no worker left, no
    hang, the loader closed."""
    _reservation_fails(monkeypatch)
    spec = {"x": ((1 << 20,), "uint8")}  # 1 MiB rows: a ring of 10s of MiB
    pf = fastq.Prefetcher(
        PatternDataset(64), batch_size=4, spec=spec, workers=2, start_method="fork"
    )
    pids = [p.pid for p in pf._engine.pool.processes]
    with pytest.raises(
        fastq.SharedMemoryError,
        match=r"needs .*MiB \(\d+ bytes\) .*No space left.*slots= or batch_size=",
    ):
        for _ in pf:
            pass
    assert pf.closed
    assert wait_gone(pids, 5) == []


@pytest.mark.timeout(30)
def test_callable_that_yields_nothing_needs_a_spec() -> None:
    with pytest.raises(fastq.ConfigError, match="yielded no item.*spec="):
        fastq.Prefetcher(CountingBatches(0), workers=1, start_method="fork")
