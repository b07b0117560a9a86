"""A worker's exception or death reaches the consumer promptly, and nothing
is left behind (the autouse clean_world fixture checks processes and
memory after each test)."""

from __future__ import annotations

import os
import signal
import time

import pytest
from helpers import FailingDataset, PatternDataset, SuicideDataset

import fastq
from fastq._core._ring import FREE, READY

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    "kind,type_name",
    [
        ("value", "ValueError"),
        ("needs-args", "NeedsArgs"),
        ("unpicklable", "Unpicklable"),
    ],
)
def test_user_exception_becomes_worker_error(
    start_method: str, kind: str, type_name: str
) -> None:
    ds = FailingDataset(40, bad=13, kind=kind)
    with fastq.Prefetcher(ds, batch_size=4, workers=2, start_method=start_method) as pf:
        got = []
        with pytest.raises(fastq.WorkerError) as info:
            for batch in pf:
                got.append(batch[1].tolist())
    err = info.value
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]  # earlier batches arrive
    assert err.task == 3 and err.sample == 13 and err.worker in (0, 1)
    assert type_name in str(err) and "sample 13" in str(err)
    assert "Traceback" in err.remote_traceback and "__getitem__" in err.remote_traceback
    assert pf.closed


def test_worker_init_failure_is_reported() -> None:
    with fastq.Prefetcher(
        PatternDataset(8),
        batch_size=2,
        workers=2,
        worker_init=failing_init,
        spec=(((3, 5, 7), "uint8"), ((), "int64"), ((), "float32")),
        start_method="fork",
    ) as pf:
        with pytest.raises(fastq.WorkerError, match="init failed in worker"):
            list(pf)


def test_worker_init_failure_without_a_spec_is_raised_by_the_constructor() -> None:
    """Worker 0 infers the spec after its worker_init: its failure leaves
    no spec and no ring, so the constructor raises it, as for a stream."""
    with pytest.raises(fastq.WorkerError, match="init failed in worker 0") as info:
        fastq.Prefetcher(
            PatternDataset(8),
            batch_size=2,
            workers=2,
            worker_init=failing_init,
            start_method="fork",
        )
    assert "failing_init" in info.value.remote_traceback


def failing_init(worker_id: int) -> None:
    raise RuntimeError(f"init failed in worker {worker_id}")


def late_failing_init(worker_id: int) -> None:
    """Worker 0 fails last: its report reaches the consumer after the
    others'."""
    if worker_id == 0:
        time.sleep(0.3)
    raise RuntimeError(f"init failed in worker {worker_id}")


@pytest.mark.parametrize("face", ["Prefetcher", "DataLoader"])
def test_the_lowest_workers_init_failure_is_raised_whichever_came_first(
    face: str,
) -> None:
    """Every worker starts at once and every worker_init fails, worker 0's
    last: worker 0's is raised, as DataLoader raises the first batch's
    error first."""
    if face == "Prefetcher":
        with pytest.raises(fastq.WorkerError, match="init failed in worker 0"):
            fastq.Prefetcher(
                PatternDataset(8),
                batch_size=2,
                workers=3,
                worker_init=late_failing_init,
                start_method="fork",
            )
        return
    fastq_torch = pytest.importorskip("fastq.torch")
    loader = fastq_torch.DataLoader(
        PatternDataset(8),
        batch_size=2,
        num_workers=3,
        worker_init_fn=late_failing_init,
        multiprocessing_context="fork",
    )
    with pytest.raises(RuntimeError, match="init failed in worker 0") as info:
        next(iter(loader))
    said = str(info.value) + "".join(getattr(info.value, "__notes__", []))
    assert "raised in fastq worker 0" in said
    assert "batch -1" not in said, "a worker_init_fn's failure belongs to no batch"


@pytest.mark.parametrize(
    "signum,name", [(signal.SIGKILL, "SIGKILL"), (signal.SIGSEGV, "SIGSEGV")]
)
def test_killed_worker_raises_worker_died_promptly(
    start_method: str, signum, name
) -> None:  # type: ignore[no-untyped-def]
    with fastq.Prefetcher(
        SuicideDataset(100, bad=21, signum=signum),
        batch_size=4,
        workers=2,
        start_method=start_method,
    ) as pf:
        t0 = time.monotonic()
        with pytest.raises(fastq.WorkerDied) as info:
            for _ in pf:
                t0 = time.monotonic()
    assert time.monotonic() - t0 < 1.0
    msg = str(info.value)
    assert name in msg and "pid" in msg and "batch 5" in msg
    if name == "SIGKILL":
        assert "out-of-memory" in msg


def test_death_after_the_last_batch_needed_is_reported_by_the_next_fetch() -> None:
    # The epoch is whole (nothing waited on the dead worker), so nothing is
    # raised during it; the next fetch must not carry on with a worker short.
    with fastq.Prefetcher(
        PatternDataset(16), batch_size=4, workers=2, start_method="fork"
    ) as pf:
        assert len(list(pf)) == 4
        os.kill(pf._pool.pids[0], signal.SIGKILL)
        time.sleep(1.0)  # the promise: reported within a second
        with pytest.raises(fastq.WorkerDied, match="SIGKILL"):
            next(iter(pf))
    assert pf.closed


def test_a_death_in_the_first_batch_without_a_spec_names_when() -> None:
    """The only worker dies making its first sample: no spec, so the
    constructor raises it; dying later in that batch, whose task the census
    records as worker 0's, it is raised at the first next() naming the
    batch."""
    kill = signal.SIGKILL
    with pytest.raises(fastq.WorkerDied, match="before the ring existed"):
        fastq.Prefetcher(
            SuicideDataset(20, bad=0, signum=kill),
            batch_size=4,
            workers=1,
            start_method="fork",
        )
    with fastq.Prefetcher(
        SuicideDataset(20, bad=1, signum=kill),
        batch_size=4,
        workers=2,
        start_method="fork",
    ) as pf:
        with pytest.raises(fastq.WorkerDied, match="while producing batch 0") as info:
            next(iter(pf))
    assert info.value.worker == 0 and info.value.task == 0


def test_a_death_in_a_first_sample_while_another_worker_sizes_the_ring() -> None:
    """Every worker begins at once: worker 0's death is raised by the
    constructor if it comes before worker 1's spec, else at the first
    next(), naming batch 0 (the census holds it as worker 0's)."""
    kill = signal.SIGKILL
    with pytest.raises(fastq.WorkerDied) as info:
        with fastq.Prefetcher(
            SuicideDataset(20, bad=0, signum=kill),
            batch_size=4,
            workers=2,
            start_method="fork",
        ) as pf:
            next(iter(pf))
    assert info.value.worker == 0
    assert "SIGKILL" in str(info.value)


def test_a_death_the_watch_has_not_reported_ends_the_epoch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A real worker SIGKILLed once every batch of the epoch is made, while
    the death watch's thread has not reported it (kept from it here, as a
    loaded machine can keep it for seconds): the epoch's end raises
    WorkerDied naming it, never ends as a clean one."""
    from multiprocessing.connection import wait

    from fastq._workers._death_watch import DeathWatch

    def silent(self: DeathWatch, died: object) -> None:
        wait([self._stop_r])  # reports nothing; leaves when the pool closes

    monkeypatch.setattr(DeathWatch, "_watch", silent)
    pf = fastq.Prefetcher(
        PatternDataset(8), batch_size=2, workers=2, slots=6, start_method="fork"
    )
    with pf:
        it = iter(pf)
        next(it)
        # Every slot published and none in a worker's hands (a batch counted
        # made is published just after: a kill in between would leave the
        # epoch a batch short, which only the silenced watch would report).
        ring, consumer = pf._engine.ring, pf._engine.feed.consumer
        deadline = time.monotonic() + 20
        while not (
            sum(w["batches"] for w in pf.stats()["workers"]) >= 4
            and ring.depth(FREE) == 0
            and ring.depth(READY) + consumer.in_window + consumer.held == ring.nslots
        ):
            assert time.monotonic() < deadline, "the epoch's batches were not made"
            time.sleep(0.01)
        victim = pf._pool.processes[1]  # type: ignore[union-attr]
        os.kill(victim.pid, signal.SIGKILL)
        assert wait([victim.sentinel], 10), "the worker did not die"
        with pytest.raises(fastq.WorkerDied, match=f"pid {victim.pid}.*SIGKILL"):
            for batch in it:
                del batch
    assert pf.closed
