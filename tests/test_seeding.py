"""Reproducible randomness: per task, never per worker, so a fixed seed
gives the same batches for any number of workers."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import RandomDataset

import fastq

pytestmark = pytest.mark.timeout(60)


def run(workers: int, seed: int) -> list[np.ndarray]:
    with fastq.Prefetcher(
        RandomDataset(),
        batch_size=4,
        workers=workers,
        seed=seed,
        shuffle=True,
        start_method="fork",
    ) as pf:
        out = []
        for _ in range(2):
            out += [np.concatenate([a.ravel(), b, c.astype(float)]) for a, b, c in pf]
        return out


def test_same_seed_same_batches_for_any_worker_count() -> None:
    one, three = run(1, seed=11), run(3, seed=11)
    assert len(one) == 32
    for a, b in zip(one, three):
        np.testing.assert_array_equal(a, b)


def test_other_seed_other_batches() -> None:
    a, b = run(2, seed=1), run(2, seed=2)
    assert not all(np.array_equal(x, y) for x, y in zip(a, b))


def test_workers_get_their_info() -> None:
    assert fastq.get_worker_info() is None
    with fastq.Prefetcher(InfoSource(), workers=3, seed=9, start_method="fork") as pf:
        infos = {tuple(row) for batch in pf for row in batch.tolist()}
    assert infos == {(w, 3, 9, 0, 1) for w in range(3)}


class InfoSource:
    def __call__(self):  # type: ignore[no-untyped-def]
        info = fastq.get_worker_info()
        if info is None:  # the parent's probe for the spec
            yield np.zeros((1, 5), np.int64)
            return
        yield np.array(
            [[info.id, info.num_workers, info.seed, info.rank, info.world_size]],
            np.int64,
        )


class ThreadsSource:
    def __call__(self):  # type: ignore[no-untyped-def]
        import ctypes

        from fastq._workers._threads import _loaded_pool_libraries

        counts = []
        for path in _loaded_pool_libraries():
            lib = ctypes.CDLL(path)
            for symbol in (
                "openblas_get_num_threads",
                "openblas_get_num_threads64_",
                "scipy_openblas_get_num_threads64_",
            ):
                getter = getattr(lib, symbol, None)
                if getter is not None:
                    counts.append(getter())
        yield np.array([counts or [-1]], np.int64)


def test_workers_run_one_blas_thread_by_default() -> None:
    with fastq.Prefetcher(ThreadsSource(), workers=1, start_method="forkserver") as pf:
        counts = next(iter(pf)).ravel().tolist()
    if counts == [-1]:
        pytest.skip("no OpenBLAS loaded by this numpy build")
    assert set(counts) == {1}
