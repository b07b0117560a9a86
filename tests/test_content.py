"""Bit-exact batches, in sampler order, across ring wrap-around, for every
start method, worker count and slot count."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from helpers import (
    ArrayDataset,
    Augmented,
    AugmentedFill,
    AugmentedItems,
    BatchedDataset,
    DictDataset,
    FillDataset,
    PatternDataset,
    expected_batch,
    expected_image,
)

import fastq

pytestmark = pytest.mark.timeout(120)


def assert_batch(batch: tuple[np.ndarray, ...], indices: np.ndarray) -> None:
    want = expected_batch(indices)
    assert len(batch) == 3
    for got, exp in zip(batch, want):
        assert got.shape == exp.shape and got.dtype == exp.dtype
        np.testing.assert_array_equal(got, exp)


@pytest.mark.parametrize("workers,slots", [(1, 1), (2, 3), (4, 8)])
def test_thousands_of_batches_bit_exact(
    started_by: dict[str, str], workers: int, slots: int
) -> None:
    n, bs = 2000, 3  # 667 batches per epoch, hundreds of ring wrap-arounds
    with fastq.Prefetcher(
        PatternDataset(n),
        batch_size=bs,
        workers=workers,
        slots=slots,
        **started_by,
    ) as pf:
        for _epoch in range(2):
            k = 0
            for k, batch in enumerate(pf):
                indices = np.arange(k * bs, min(n, (k + 1) * bs))
                assert_batch(batch, indices)
            assert k + 1 == len(pf) == 667


def test_partial_last_batch_has_fewer_rows() -> None:
    with fastq.Prefetcher(
        PatternDataset(10), batch_size=4, workers=2, start_method="fork"
    ) as pf:
        sizes = [len(b[1]) for b in pf]
    assert sizes == [4, 4, 2]


@pytest.mark.parametrize(
    "dataset", [BatchedDataset(50), FillDataset(50)], ids=["__getitems__", "fill_batch"]
)
def test_whole_batch_paths(dataset: PatternDataset, started_by: dict[str, str]) -> None:
    with fastq.Prefetcher(
        dataset, batch_size=8, workers=2, slots=3, **started_by
    ) as pf:
        for k, batch in enumerate(pf):
            assert_batch(batch, np.arange(k * 8, min(50, (k + 1) * 8)))
        assert k == 6


def test_dict_samples_give_dict_batches() -> None:
    with fastq.Prefetcher(
        DictDataset(20), batch_size=5, workers=2, start_method="fork"
    ) as pf:
        batches = [(b["image"].copy(), b["index"].copy()) for b in pf]
    assert len(batches) == 4
    for k, (image, index) in enumerate(batches):
        np.testing.assert_array_equal(index, np.arange(k * 5, k * 5 + 5))
        np.testing.assert_array_equal(image[0], expected_image(k * 5))


def test_single_array_samples_give_array_batches() -> None:
    with fastq.Prefetcher(
        ArrayDataset(9), batch_size=4, workers=1, start_method="fork"
    ) as pf:
        batches = [b.copy() for b in pf]
    assert [b.shape for b in batches] == [(4, 4), (4, 4), (1, 4)]
    np.testing.assert_array_equal(batches[2], np.full((1, 4), 8, np.int32))


def test_views_are_writable_numpy_arrays() -> None:
    with fastq.Prefetcher(
        PatternDataset(8), batch_size=4, workers=1, start_method="fork"
    ) as pf:
        image, _, _ = next(iter(pf))
        assert type(image) is np.ndarray and image.flags.writeable
        image[0, 0, 0, 0] = 42  # the consumer may scribble on its batch
        assert image[0, 0, 0, 0] == 42


def test_copy_true_hands_out_owned_arrays() -> None:
    with fastq.Prefetcher(
        PatternDataset(40),
        batch_size=4,
        workers=2,
        slots=2,
        copy=True,
        start_method="fork",
    ) as pf:
        kept = list(pf)  # more batches than slots: only possible with copies
        assert all(b[0].base is None for b in kept)
    for k, batch in enumerate(kept):
        assert_batch(batch, np.arange(k * 4, k * 4 + 4))


@pytest.mark.parametrize(
    "dataset",
    [Augmented, AugmentedItems, AugmentedFill],
    ids=["getitem", "getitems", "fill"],
)
@pytest.mark.parametrize(
    "how",
    [{"start_method": "fork"}, {"worker_method": "thread"}],
    ids=["fork", "thread"],
)
def test_batches_without_spec_are_those_given_spec(
    dataset: type[Augmented], how: dict[str, str]
) -> None:
    """Worker 0's first batch, made before the ring to infer the spec, is
    seeded as that batch always is: bit for bit a run given spec=."""

    def run(spec: Any) -> list[list[np.ndarray]]:
        with fastq.Prefetcher(
            dataset(22),
            batch_size=4,
            workers=3,
            shuffle=True,
            seed=5,
            spec=spec,
            copy=True,
            **how,
        ) as pf:
            return [list(b) for _ in range(2) for b in pf]

    given = run((((), "int64"), ((2,), "float64"), ((), "float64"), ((), "float64")))
    inferred = run(None)
    assert len(inferred) == len(given) == 12
    # Thread workers leave `random` and `np.random` alone: the batch's
    # rng is theirs.
    fields = 2 if "worker_method" in how else 4
    for a, b in zip(inferred, given):
        for x, y in zip(a[:fields], b[:fields]):
            assert x.dtype == y.dtype
            np.testing.assert_array_equal(x, y)
    assert inferred[0][0].tolist() != [0, 1, 2, 3]  # shuffled
