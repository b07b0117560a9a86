"""worker_method="thread": the same ring and guarantees in threads of the
consumer's process (content, order and every batch once are covered with
every start method in test_content.py and test_callable.py). Here, what
is particular to threads: nothing is pickled and no process starts; the
training process's global random state is left alone while every batch's
own generator is reproducible; errors and timeouts arrive with the
thread's traceback and stack; a thread stuck in user code bounds close()
and does not hold the interpreter's exit; a state resumes across worker
methods."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import numpy as np
import pytest
from helpers import PatternDataset, RandomDataset, expected_batch, worker_info
from process_checks import child_pids

import fastq

pytestmark = pytest.mark.timeout(60)


def workers_alive() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("fastq-worker")]


def test_no_process_and_no_pickling() -> None:
    class Local:  # a local class: no process worker could unpickle it
        def __init__(self) -> None:
            self.lock = threading.Lock()  # nor could pickle send it

        def __len__(self) -> int:
            return 40

        def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
            return np.full(3, i, dtype=np.int32), i

    with fastq.Prefetcher(
        Local(), batch_size=4, workers=3, worker_method="thread"
    ) as pf:
        got = [int(i) for b in pf for i in b[1]]
        assert child_pids() == []
        assert len(workers_alive()) == 3
        info = pf.stats()["workers"]
    assert got == list(range(40))
    assert sum(w["batches"] for w in info) >= 10  # and the next epoch's first
    deadline = time.monotonic() + 2
    while workers_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert workers_alive() == []


def test_each_thread_has_its_own_worker_info() -> None:
    def source() -> Any:
        info = fastq.get_worker_info()
        assert info is not None
        yield (np.array([info.id]), np.array([threading.get_ident()]))

    with fastq.Prefetcher(source, workers=3, worker_method="thread") as pf:
        pairs = {(int(a[0]), int(b[0])) for a, b in pf}
    assert {w for w, _ in pairs} == {0, 1, 2}
    assert len({t for _, t in pairs}) == 3
    assert fastq.get_worker_info() is None  # not in the consumer's thread


class Augmented:
    """Draws only from the batch's own generator, as thread workers ask
    (its first batch too: the spec is inferred in a worker thread)."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> tuple[int, float]:
        return i, worker_info().rng.random()


def test_batch_randomness_is_reproducible_and_globals_are_left_alone() -> None:
    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    runs = []
    for workers in (1, 3):
        with fastq.Prefetcher(
            Augmented(),
            batch_size=4,
            workers=workers,
            seed=7,
            worker_method="thread",
        ) as pf:
            runs.append([b[1].copy() for b in pf])
    # info.rng is a function of (seed, epoch, batch), whatever the thread.
    assert all(np.array_equal(a, b) for a, b in zip(*runs))
    assert np.array_equal(np.random.get_state()[1], before)


class Failing:
    def __len__(self) -> int:
        return 20

    def __getitem__(self, i: int) -> np.ndarray:
        if i == 9:
            raise KeyError(f"sample {i} is missing")
        return np.zeros(2)


def test_an_exception_arrives_at_its_batch_with_the_threads_traceback() -> None:
    pf = fastq.Prefetcher(Failing(), batch_size=2, workers=2, worker_method="thread")
    seen = 0
    with pytest.raises(fastq.WorkerError) as err:
        for _ in pf:
            seen += 1
    assert seen == 4  # batches 0 to 3, then batch 4 (samples 8, 9)
    assert "sample 9 is missing" in str(err.value)
    assert "__getitem__" in str(err.value)  # the worker's traceback
    assert pf.closed


class Stuck:
    """Batch 2 blocks in user code for a while: a thread cannot be killed."""

    release = threading.Event()

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> np.ndarray:
        if i == 4:
            self.release.wait(10)
        return np.full(2, i)


def test_a_timeout_shows_the_threads_stack_and_close_is_bounded() -> None:
    Stuck.release.clear()
    pf = fastq.Prefetcher(
        Stuck(), batch_size=2, workers=2, timeout=0.5, worker_method="thread"
    )
    with pytest.raises(fastq.FetchTimeout, match=r"(?s)batch 2.*in __getitem__"):
        for _ in pf:
            pass
    t0 = time.monotonic()
    pf.close()
    assert time.monotonic() - t0 < 3  # the stuck thread is not waited for
    Stuck.release.set()  # its call returns; it finds the ring closed and ends
    deadline = time.monotonic() + 5
    while workers_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert workers_alive() == []


def test_a_thread_stuck_in_user_code_does_not_hold_the_exit() -> None:
    script = textwrap.dedent(
        """
        import time
        import numpy as np
        import fastq

        class Forever:
            def __len__(self):
                return 8
            def __getitem__(self, i):
                if i == 2:
                    time.sleep(3600)
                return np.zeros(2)

        pf = fastq.Prefetcher(Forever(), batch_size=2, workers=1,
                              worker_method="thread", timeout=0.3)
        try:
            list(pf)
        except fastq.FetchTimeout:
            print("timeout", flush=True)
        # no close(): the exit closes the Prefetcher
        """
    )
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    assert "timeout" in out.stdout
    assert time.monotonic() - t0 < 20


def test_a_state_resumes_across_worker_methods() -> None:
    kw: dict[str, Any] = {"batch_size": 4, "shuffle": True, "seed": 3}
    with fastq.Prefetcher(RandomDataset(), workers=2, **kw) as pf:
        whole = [b[2].copy() for b in pf]
    with fastq.Prefetcher(RandomDataset(), workers=2, **kw) as pf:
        it = iter(pf)
        first = [next(it)[2].copy() for _ in range(5)]
        state = pf.state_dict()
    with fastq.Prefetcher(
        RandomDataset(), workers=3, worker_method="thread", state=state, **kw
    ) as pf:
        rest = [b[2].copy() for b in pf]
    assert all(np.array_equal(a, b) for a, b in zip(first + rest, whole))
    assert len(first + rest) == len(whole)


def test_arguments_that_do_not_apply_are_refused() -> None:
    with pytest.raises(fastq.ConfigError, match="start_method='spawn' with worker_"):
        fastq.Prefetcher(
            RandomDataset(), batch_size=4, worker_method="thread", start_method="spawn"
        )
    with pytest.raises(fastq.ConfigError, match="worker_method='fiber'"):
        fastq.Prefetcher(RandomDataset(), batch_size=4, worker_method="fiber")


def test_a_torch_prefetcher_runs_thread_workers() -> None:
    """TorchPrefetcher's tensors over the slot, made by threads, bit for
    bit and in order."""
    torch = pytest.importorskip("torch")
    from fastq.torch import TorchPrefetcher

    with TorchPrefetcher(
        PatternDataset(40), 4, workers=2, worker_method="thread"
    ) as pf:
        batches = [tuple(t.clone() for t in b) for b in pf]
    assert len(batches) == 10
    for k, batch in enumerate(batches):
        for t, want in zip(batch, expected_batch(range(4 * k, 4 * k + 4))):
            assert isinstance(t, torch.Tensor) and np.array_equal(t.numpy(), want)
