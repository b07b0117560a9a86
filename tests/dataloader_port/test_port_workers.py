"""PyTorch's test/test_dataloader.py, ported (port_support.py says how):
worker info, seeds and init functions, and iterable datasets."""

from __future__ import annotations

import os
import warnings
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from port_support import (  # noqa: E402
    FASTQ,
)
from torch.utils.data import (  # noqa: E402
    ChainDataset,
)
from torch_helpers import dataloader_port_data as port  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(60)]


def test_get_worker_info(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_get_worker_info (in this
    process; the workers' pids are taken from the samples). The workers'
    first samples wait for each other, so every worker must begin at once"""
    assert torch.utils.data.get_worker_info() is None
    dataset = port.SynchronizedWorkerInfoDataset(6, batch_size=2, num_workers=2)
    loader = DataLoader(
        dataset, batch_size=2, num_workers=2, worker_init_fn=port.worker_info_init_fn
    )
    rows = torch.cat(list(loader), 0).tolist()
    assert len(rows) == 6
    pids_of: dict[int, set[int]] = {}
    for worker_id, pid in rows:
        pids_of.setdefault(worker_id, set()).add(pid)
    assert set(pids_of) == {0, 1}  # the barrier needs both
    assert all(len(p) == 1 for p in pids_of.values())
    pids = [p for ps in pids_of.values() for p in ps]
    assert len(set(pids)) == len(pids)
    assert os.getpid() not in pids
    assert torch.utils.data.get_worker_info() is None
    assert not hasattr(dataset, "value")
    with pytest.raises(AttributeError):
        dataset[0]


def test_worker_seed(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_worker_seed (each of 6
    workers makes one sample, all at once behind a barrier, and each sees
    its own torch seed)"""
    num_workers = 6
    dataset = port.SynchronizedSeedDataset(num_workers, 1, num_workers)
    loader = DataLoader(dataset, batch_size=1, num_workers=num_workers)
    seeds = {int(batch[0]) for batch in loader}
    assert len(seeds) == num_workers


def test_worker_seed_reproducibility(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_worker_seed_reproducibility
    (6 workers behind a barrier, twice with one generator seed)"""
    num_workers = 6

    def seeds() -> set[int]:
        dataset = port.SynchronizedSeedDataset(num_workers, 1, num_workers)
        loader = DataLoader(
            dataset,
            batch_size=1,
            num_workers=num_workers,
            generator=torch.Generator().manual_seed(42),
        )
        return {int(batch) for batch in loader}

    first = seeds()
    assert len(first) == num_workers
    assert first == seeds()


def test_out_of_order_index_ds(DataLoader: Any) -> None:
    """test_dataloader.py: TestOutOfOrderDataLoader.test_out_of_order_index_ds
    (in_order=False: the slow sample 0 does not hold the others; the
    original's exact order has sample 2 queued behind it on worker 0, which
    holds against DataLoader only: fastq gives a batch to the first free
    worker, a row of the migration table)"""
    dataset = port.SlowIndexDataset(end=10, slow_index=0)
    loader = DataLoader(dataset, num_workers=2, in_order=False)
    outputs = [(int(w), int(i)) for w, i in loader]
    data = [i for _, i in outputs]
    assert sorted(data) == list(range(10))
    assert outputs[0] == (1, 1)  # the other worker's, not the slow one's
    assert outputs[-1][1] in (0, 2) and data.index(0) >= 8
    assert [i for i in data if i not in (0, 2)] == [1, 3, 4, 5, 6, 7, 8, 9]
    assert [w for w, i in outputs if i == 0] == [0]
    assert {w for w, i in outputs if i not in (0, 2)} == {1}
    if not FASTQ:
        assert data == [1, 3, 4, 5, 6, 7, 8, 9, 0, 2]


def test_worker_init_fn(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_worker_init_fn (a seed set in
    worker_init_fn is the one __getitem__ sees)"""
    loader = DataLoader(
        port.SeedDataset(4),
        batch_size=2,
        num_workers=2,
        worker_init_fn=port.seed_12345_init_fn,
    )
    batches = [b.tolist() for b in loader]
    assert batches == [[12345, 12345], [12345, 12345]]


@pytest.mark.parametrize("num_workers", [1, 2])
def test_ind_worker_queue(DataLoader: Any, num_workers: int) -> None:
    """test_dataloader.py: TestIndividualWorkerQueue.test_ind_worker_queue
    (batches in order, each made by one worker whose bound-method
    worker_init_fn ran on that worker's dataset copy; batch i by worker
    i % num_workers against DataLoader only: fastq gives a map-style batch
    to the first worker with a free slot, a row of the migration table. An
    IterableDataset's batches do come in turn, as
    test_multi_epochs_reproducibility checks)"""
    for batch_size in (8, 16):
        dataset = port.WorkerQueueDataset(list(range(128)))
        loader = DataLoader(
            dataset,
            batch_size=batch_size,
            shuffle=False,
            num_workers=num_workers,
            timeout=30,  # the original's 5 s, with room for a loaded machine
            worker_init_fn=dataset.worker_init_fn,
        )
        n = 0
        for i, (worker_ids, sample) in enumerate(loader):
            ids = set(worker_ids.tolist())
            assert len(ids) == 1 and ids <= set(range(num_workers))
            if not FASTQ:
                assert ids == {i % num_workers}
            want = list(range(i * batch_size, (i + 1) * batch_size))
            assert sample.tolist() == want
            n += 1
        assert n == 128 // batch_size


# ------------------------------------------------------ iterable datasets


def test_iterable_style_dataset_single_process(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_iterable_style_dataset (the
    single process parts: no auto-batching keeps ints; batch_size=7 with and
    without drop_last)"""
    dataset = port.CountingIterableDataset(20)
    loader = DataLoader(dataset, batch_size=None, num_workers=0)
    fetched = list(loader)
    assert fetched == list(range(20))
    assert all(type(d) is int for d in fetched)
    assert len(loader) == len(dataset)

    fetched = [t.tolist() for t in DataLoader(dataset, batch_size=7, num_workers=0)]
    assert fetched == [list(range(7)), list(range(7, 14)), list(range(14, 20))]
    loader = DataLoader(dataset, batch_size=7, drop_last=True, num_workers=0)
    assert [t.tolist() for t in loader] == [list(range(7)), list(range(7, 14))]


def test_iterable_style_dataset_default_num_workers(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_iterable_style_dataset ([no
    auto-batching] single process loading, with num_workers left out: an
    IterableDataset that does not shard itself is read once, ints stay ints;
    fastq's default for it is one worker, DataLoader's is none)"""
    dataset = port.CountingIterableDataset(20)
    loader = DataLoader(dataset, batch_size=None)
    assert loader.num_workers == (1 if FASTQ else 0)
    fetched = list(loader)
    assert fetched == list(range(20))
    assert all(type(d) is int for d in fetched)
    assert len(loader) == len(dataset)


@pytest.mark.parametrize("prefetch_factor", [2, 4])
def test_iterable_style_dataset_workers_nobatch(
    DataLoader: Any, prefetch_factor: int
) -> None:
    """test_dataloader.py: TestDataLoader.test_iterable_style_dataset ([no
    auto-batching] multiprocessing loading; one worker yields nothing)"""
    dataset = port.WorkerSpecificIterableDataset([0, 20])
    loader = DataLoader(
        dataset, num_workers=2, batch_size=None, prefetch_factor=prefetch_factor
    )
    fetched = sorted(loader)
    assert fetched == list(range(20))
    assert all(type(d) is int for d in fetched)
    assert len(loader) == len(dataset)


@pytest.mark.parametrize("drop_last", [False, True])
def test_iterable_style_dataset_workers_batched(
    DataLoader: Any, drop_last: bool
) -> None:
    """test_dataloader.py: TestDataLoader.test_iterable_style_dataset
    ([auto-batching] and [auto-batching & drop_last] multiprocessing loading:
    each worker batches its own samples)"""
    dataset = port.WorkerSpecificIterableDataset([4, 20])
    loader = DataLoader(dataset, num_workers=2, batch_size=7, drop_last=drop_last)
    fetched = [tuple(t.tolist()) for t in loader]
    want = {tuple(range(7)), tuple(range(7, 14))}
    if not drop_last:
        want |= {tuple(range(4)), tuple(range(14, 20))}
    assert len(fetched) == len(want)
    assert set(fetched) == want


def test_iterable_style_dataset_length_warning(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_iterable_style_dataset (after
    len(dataloader), fetching more samples than the reported length warns;
    before it, or within the length, nothing warns)"""
    dataset = port.CountingIterableDataset(20)  # every worker yields all 20
    loader = DataLoader(dataset, num_workers=2)
    it = iter(loader)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(40):
            next(it)
    assert [str(w.message) for w in caught] == []
    assert len(loader) == len(dataset) == 20
    it = iter(loader)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(20):
            next(it)
    assert [str(w.message) for w in caught] == []
    for _ in range(3):
        with pytest.warns(UserWarning, match=r"\b20\b"):
            next(it)


@pytest.mark.parametrize("num_workers", [0, 1])
def test_builtin_collection_conversion(DataLoader: Any, num_workers: int) -> None:
    """test_dataloader.py: TestDataLoader.test_builtin_collection_conversion"""
    pairs = [[i, i + 1] for i in range(0, 20, 2)]
    for coll_ty in (list, tuple):
        for dataset in (port.CountingDataset(20), port.CountingIterableDataset(20)):
            loader = DataLoader(dataset, batch_size=None, num_workers=num_workers)
            assert coll_ty(loader) == coll_ty(range(20))
            loader = DataLoader(dataset, batch_size=2, num_workers=num_workers)
            fetched = coll_ty(loader)
            assert isinstance(fetched, coll_ty)
            assert [t.tolist() for t in fetched] == pairs


@pytest.mark.parametrize("num_workers", [0, 1])
def test_chain_iterable_style_dataset(DataLoader: Any, num_workers: int) -> None:
    """test_dataloader.py: TestDataLoader.test_chain_iterable_style_dataset"""
    dataset1 = port.CountingIterableDataset(20)
    dataset2 = port.CountingIterableDataset(15)
    expected = list(range(20)) + list(range(15))
    for chained in (dataset1 + dataset2, ChainDataset([dataset1, dataset2])):
        fetched = list(DataLoader(chained, num_workers=num_workers))
        assert len(fetched) == len(expected)
        for e, d in zip(expected, fetched):
            assert isinstance(d, torch.Tensor)
            assert d.tolist() == [e]
