"""Every slot is accounted for: interrupts at random points, a forked child
holding batches, a worker stopped or killed inside a queue operation, leases
in reference cycles, and the ring's size arithmetic. Each test injects the
fault for real."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import PatternDataset, expected_batch, process_state

import fastq
from fastq._core._ring import LOCAL_NONE, OWNER_CONSUMER, inject_fault, region_size
from fastq.errors import RingError

pytestmark = pytest.mark.timeout(120)

HERE = Path(__file__).resolve().parent


def whole_epoch(pf: fastq.Prefetcher, n: int, rows: int) -> None:
    k = 0
    for k, batch in enumerate(pf):
        for got, want in zip(batch, expected_batch(range(k * rows, (k + 1) * rows))):
            np.testing.assert_array_equal(got, want)
    assert k == n // rows - 1


def assert_books_balance(pf: fastq.Prefetcher) -> None:
    consumer = pf._feed.consumer
    _, odd = consumer.audit()
    assert odd == -1, f"slot {odd}: the census and the consumer's books disagree"
    assert consumer.held == 0 and consumer.ndeferred == 0


# -------------------------------------------------------------- interrupts


@pytest.mark.parametrize("seed", [1, 2])
def test_hundreds_of_sigints_lose_no_slot_and_no_batch(
    start_method: str, seed: int
) -> None:
    """A notebook's interrupt button pressed 300 times at random points of a
    tight loop, each KeyboardInterrupt caught: an interrupted iterator goes
    on with the batch it was handing out, an abandoned loop is simply left,
    and afterwards full epochs are exact and every slot is back."""
    proc = subprocess.run(
        [sys.executable, str(HERE / "sigint_storm.py"), start_method, "300", str(seed)],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["caught"] >= 200, seen  # real interrupts landed
    assert seen["resumed_epochs"] >= 1, seen
    assert seen["census"]["held"] == 0 and seen["census"]["odd"] == -1


# -------------------------------------------------------------------- fork


def test_a_forked_child_cannot_free_or_take_the_parents_slots() -> None:
    with fastq.Prefetcher(
        PatternDataset(200), batch_size=4, workers=2, slots=4, start_method="forkserver"
    ) as pf:
        it = iter(pf)
        held = [next(it) for _ in range(3)]
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: drops what it inherited, tries to use it
            code = 0
            try:
                del held
                gc.collect()
                try:
                    iter(pf)
                    code = 3
                except fastq.PrefetcherClosed:
                    pass
                pf.close()  # inert here
            except BaseException:
                code = 4
            os.write(w, bytes([code]))
            os._exit(code)
        os.close(w)
        os.waitpid(pid, 0)
        assert os.read(r, 1) == b"\x00", "the child could iterate the parent's ring"
        os.close(r)
        assert not pf.closed
        consumer = pf._feed.consumer
        assert consumer.held == 3, "the child's garbage freed the parent's slots"
        _, odd = consumer.audit()
        assert odd == -1
        # Nothing overwrote what the parent holds, while the ring went round.
        rest = [tuple(np.copy(a) for a in b) for b in it]
        for k, batch in enumerate(held):
            for got, want in zip(batch, expected_batch(range(4 * k, 4 * k + 4))):
                np.testing.assert_array_equal(got, want)
        assert len(rest) == 50 - 3
        del held, batch, got
        assert_books_balance(pf)
        whole_epoch(pf, 200, 4)


# --------------------------------------------- inside a queue operation


class _StopInside:
    """worker_init: worker 1 stops itself (SIGSTOP) inside its n-th FREE
    pop, between the tail CAS and the cell release."""

    def __init__(self, point: str, countdown: int, signum: int) -> None:
        self.point, self.countdown, self.signum = point, countdown, signum

    def __call__(self, worker_id: int) -> None:
        if worker_id == 1:
            inject_fault(self.point, self.countdown, self.signum)


def test_a_worker_paused_inside_a_pop_costs_nothing_once_it_resumes() -> None:
    """A worker stopped (SIGSTOP: a debugger, a throttled cgroup) between
    its FREE tail CAS and its cell release: the consumer's releases that
    meet that cell are kept and retried, the other worker goes on, nothing
    fails, and after SIGCONT every batch arrives exactly once. The epoch
    is long, so that on a busy machine, where worker 1 may start late, the
    other worker's releases still lap the FREE queue after the stop."""
    n, rows = 4000, 2
    with fastq.Prefetcher(
        PatternDataset(n),
        batch_size=rows,
        workers=2,
        slots=3,
        start_method="fork",
        worker_init=_StopInside("pop_free", 3, signal.SIGSTOP),
    ) as pf:
        victim = pf._pool.pids[1]
        deferred_seen = 0
        resumer: threading.Timer | None = None
        got = []
        for _k, batch in enumerate(pf):
            got.append(int(batch[1][0]))
            if resumer is None and process_state(victim) == "T":
                # Resume it later, from another thread, while we go on.
                resumer = threading.Timer(1.0, os.kill, (victim, signal.SIGCONT))
                resumer.start()
            deferred_seen = max(deferred_seen, pf._feed.consumer.ndeferred)
            del batch
        assert resumer is not None, "the worker never stopped inside its pop"
        resumer.join()
        assert got == list(range(0, n, rows)), "a batch was lost or repeated"
        assert deferred_seen > 0, "no release met the stopped popper's cell"
        assert_books_balance(pf)
        whole_epoch(pf, n, rows)


@pytest.mark.parametrize(
    "point, words",
    [
        ("pop_free", "worker 1"),
        # Named only when no other worker is between its pop and its
        # record at that moment; the slot it held is always named.
        ("claim", "before its next batch was recorded"),
        # The fault point sits before the census moves to READY, so the
        # batch is named as the one it was producing.
        ("push_ready", r"batch \d+ \(slot \d+\)"),
    ],
)
def test_a_worker_killed_inside_a_queue_operation_gives_worker_died(
    point: str, words: str
) -> None:
    """SIGKILL between a CAS and its cell release (or between a claim and
    its record): WorkerDied names the worker (and the batch lost with it),
    within a second, never a RingError, a silent loss or a hang. The epochs
    are long, so that on a busy machine, where worker 1 may start late, it
    still reaches its n-th claim before worker 0 alone ends them."""
    with fastq.Prefetcher(
        PatternDataset(4000),
        batch_size=2,
        workers=2,
        slots=3,
        start_method="fork",
        worker_init=_StopInside(point, 4, signal.SIGKILL),
    ) as pf:
        with pytest.raises(fastq.WorkerDied, match=words) as info:
            for _ in range(5):
                for batch in pf:
                    del batch
        assert info.value.worker == 1
        assert "SIGKILL" in str(info.value)
        if point == "push_ready" or "just claimed" in str(info.value):
            assert info.value.task is not None


def test_a_release_past_a_dead_poppers_cell_is_kept_not_raised() -> None:
    """The consumer's FREE push that meets a cell whose popper died never
    raises RingError and never loses the slot: it is kept, and the death
    arrives as WorkerDied."""
    with fastq.Prefetcher(
        PatternDataset(400),
        batch_size=2,
        workers=2,
        slots=2,
        start_method="fork",
        worker_init=_StopInside("pop_free", 2, signal.SIGKILL),
    ) as pf:
        with pytest.raises(fastq.WorkerDied, match="worker 1"):
            for _ in range(5):
                for batch in pf:
                    del batch
        states = pf._feed.consumer.local_states()
        # Every slot the consumer took is still in its books: none vanished.
        assert (
            pf._feed.consumer.held
            + pf._feed.consumer.in_window
            + pf._feed.consumer.ndeferred
            == sum(s != LOCAL_NONE for s in states)
        )


# ------------------------------------------------------- reference cycles


def test_a_batch_in_a_reference_cycle_still_returns_its_slot() -> None:
    with fastq.Prefetcher(
        PatternDataset(400), batch_size=4, workers=1, slots=2, start_method="fork"
    ) as pf:
        it = iter(pf)
        consumer = pf._feed.consumer
        gc.disable()
        try:
            for _ in range(40):
                cycle: list[object] = [next(it)]
                cycle.append(cycle)  # the batch is reachable only from a cycle
                del cycle
                gc.collect(0)  # with gc off, the cycle is still in generation 0
                assert consumer.held == 0, "a lease in a cycle kept its slot"
        finally:
            gc.enable()
        assert_books_balance(pf)


# ---------------------------------------------------------------- layout


def test_region_size_refuses_sizes_that_wrap() -> None:
    with pytest.raises(ValueError):
        region_size(1, 1, 2**64 - 1, 4096)
    with pytest.raises(ValueError):
        region_size(2**20, 1, 2**62, 4096)
    assert region_size(1, 1, 1, 4096) >= 2 * 4096


def test_a_census_that_disagrees_is_an_error_naming_the_slot() -> None:
    """Memory corruption stands in for a lost slot: the census gives the
    consumer a slot its books do not have. Before sleeping, the consumer
    raises RingError naming the slot and its last holder, never hangs."""
    with fastq.Prefetcher(
        PatternDataset(400), batch_size=2, workers=1, slots=3, start_method="fork"
    ) as pf:
        it = iter(pf)
        first = next(it)
        worker = pf._pool.pids[0]
        os.kill(worker, signal.SIGSTOP)  # nothing rewrites the census now
        try:
            while process_state(worker) != "T":
                time.sleep(0.01)
            del first  # its slot goes back to FREE and stays there
            ring = pf._ring
            free = [s for s, (kind, _, _) in enumerate(ring.census()) if kind == 0]
            assert free, "no slot on FREE to corrupt"
            words = np.frombuffer(pf._region.mapping, dtype=np.uint32)
            # owner sits 8 bytes into the slot's header (after the task)
            words[(ring.headers_offset + 64 * free[0] + 8) // 4] = OWNER_CONSUMER
            del words
            with pytest.raises(RingError, match=f"slot {free[0]} is unaccounted for"):
                for _ in range(10):
                    next(it)
            assert pf.closed
        finally:
            with contextlib.suppress(ProcessLookupError):  # close() reaped it
                os.kill(worker, signal.SIGCONT)


def test_a_helper_forked_mid_epoch_that_exits_normally_leaves_the_workers_alone(
    start_method: str,
) -> None:
    """A training script forks a helper that ends with sys.exit: the exit
    handlers of multiprocessing run in the helper, and must not SIGTERM the
    parent's workers, which are not its children."""
    script = f"""
import os, sys, time
sys.path.insert(0, {str(HERE)!r})
import fastq
from helpers import PatternDataset
if __name__ == "__main__":
    with fastq.Prefetcher(PatternDataset(400), batch_size=4, workers=2,
                          start_method={start_method!r}) as pf:
        for k, batch in enumerate(pf):
            if k == 10:
                pid = os.fork()
                if pid == 0:
                    time.sleep(0.05)
                    sys.exit(0)
                os.waitpid(pid, 0)
        print("second epoch", sum(1 for _ in pf))
"""
    path = HERE / f"_forked_helper_{os.getpid()}.py"
    path.write_text(script)
    try:
        proc = subprocess.run(
            [sys.executable, str(path)], capture_output=True, text=True, timeout=60
        )
    finally:
        path.unlink()
    assert proc.returncode == 0, proc.stderr
    assert "second epoch 100" in proc.stdout


def test_fetch_timeout_names_a_worker_stopped_inside_its_pop() -> None:
    with fastq.Prefetcher(
        PatternDataset(4000),
        batch_size=2,
        workers=2,
        slots=3,
        timeout=1.0,
        start_method="fork",
        worker_init=_StopInside("pop_free", 3, signal.SIGSTOP),
    ) as pf:
        victim = pf._pool.pids[1]
        try:
            with pytest.raises(
                fastq.FetchTimeout, match="stopped inside a queue operation"
            ):
                for batch in pf:
                    del batch
        finally:
            with contextlib.suppress(ProcessLookupError):  # close() reaped it
                os.kill(victim, signal.SIGCONT)
