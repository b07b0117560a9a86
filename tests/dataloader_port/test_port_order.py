"""PyTorch's test/test_dataloader.py, ported (port_support.py says how):
sequential and shuffled loading, and samplers."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from port_support import (  # noqa: E402
    PERSISTENT,
    Tensors,
    check_sequential,
    check_shuffled,
    ints,
)
from torch.utils.data import (  # noqa: E402
    RandomSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)
from torch.utils.data.distributed import DistributedSampler  # noqa: E402
from torch_helpers import dataloader_port_data as port  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(60)]


def test_sequential_nonbatch(DataLoader: Any, td: Tensors) -> None:
    """test_dataloader.py: TestDataLoader.test_sequential_nonbatch"""
    check_sequential(DataLoader(td.dataset, batch_size=None), td)


def test_sequential_batch(DataLoader: Any, td: Tensors) -> None:
    """test_dataloader.py: TestDataLoader.test_sequential_batch"""
    check_sequential(DataLoader(td.dataset), td)
    check_sequential(DataLoader(td.dataset, batch_size=2), td)


@PERSISTENT
def test_sequential_workers(
    DataLoader: Any, td: Tensors, persistent_workers: bool
) -> None:
    """test_dataloader.py: TestDataLoader.test_sequential_workers (and
    TestDataLoaderPersistentWorkers's)"""
    loader = DataLoader(
        td.dataset, num_workers=2, persistent_workers=persistent_workers
    )
    check_sequential(loader, td)


def test_seqential_batch_workers(DataLoader: Any, td: Tensors) -> None:
    """test_dataloader.py: TestDataLoader.test_seqential_batch_workers"""
    check_sequential(DataLoader(td.dataset, batch_size=2, num_workers=2), td)


def test_seqential_batch_workers_prefetch(DataLoader: Any, td: Tensors) -> None:
    """test_dataloader.py: TestDataLoader.test_seqential_batch_workers_prefetch"""
    loader = DataLoader(td.dataset, batch_size=2, num_workers=2, prefetch_factor=3)
    check_sequential(loader, td)


def test_shuffle(DataLoader: Any, td: Tensors) -> None:
    """test_dataloader.py: TestDataLoader.test_shuffle"""
    check_shuffled(DataLoader(td.dataset, shuffle=True), td)


def test_shuffle_batch_none(DataLoader: Any, td: Tensors) -> None:
    """test_dataloader.py: TestDataLoader.test_shuffle_batch_none"""
    check_shuffled(DataLoader(td.dataset, batch_size=None, shuffle=True), td)


def test_shuffle_batch(DataLoader: Any, td: Tensors) -> None:
    """test_dataloader.py: TestDataLoader.test_shuffle_batch"""
    check_shuffled(DataLoader(td.dataset, batch_size=2, shuffle=True), td)


@PERSISTENT
def test_shuffle_workers(
    DataLoader: Any, td: Tensors, persistent_workers: bool
) -> None:
    """test_dataloader.py: TestDataLoader.test_shuffle_workers (and
    TestDataLoaderPersistentWorkers's)"""
    loader = DataLoader(
        td.dataset, shuffle=True, num_workers=2, persistent_workers=persistent_workers
    )
    check_shuffled(loader, td)


def test_shuffle_batch_workers(DataLoader: Any, td: Tensors) -> None:
    """test_dataloader.py: TestDataLoader.test_shuffle_batch_workers"""
    loader = DataLoader(td.dataset, batch_size=2, shuffle=True, num_workers=2)
    check_shuffled(loader, td)


def test_shuffle_batch_workers_prefetch(DataLoader: Any, td: Tensors) -> None:
    """test_dataloader.py: TestDataLoader.test_shuffle_batch_workers_prefetch"""
    loader = DataLoader(
        td.dataset, batch_size=2, shuffle=True, num_workers=2, prefetch_factor=3
    )
    check_shuffled(loader, td)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_shuffle_reproducibility(
    DataLoader: Any, td: Tensors, num_workers: int
) -> None:
    """test_dataloader.py: TestDataLoader.test_shuffle_reproducibility (also
    list() of a loader of 100 batches)"""

    def epoch() -> list[tuple[Any, Any]]:
        loader = DataLoader(
            td.dataset,
            shuffle=True,
            num_workers=num_workers,
            generator=torch.Generator().manual_seed(42),
        )
        return [(x.clone(), y.clone()) for x, y in list(loader)]

    first, second = epoch(), epoch()
    assert len(first) == len(second) == 100
    for (x1, y1), (x2, y2) in zip(first, second):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)


# --------------------------------------------------------------- samplers


def test_random_sampler(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_random_sampler (the samples a
    loader delivers from each RandomSampler, rather than the sampler alone)"""
    ds = port.CountingDataset(100)

    def stat(sampler: Any) -> tuple[int, int, int, int]:
        counts = Counter(ints(DataLoader(ds, batch_size=None, sampler=sampler)))
        repeated = sum(c > 1 for c in counts.values())
        return repeated, min(counts), max(counts), sum(counts.values())

    repeated, lo, hi, total = stat(RandomSampler(ds, replacement=True, num_samples=101))
    assert repeated > 0 and lo >= 0 and hi < 100 and total == 101

    assert stat(RandomSampler(ds)) == (0, 0, 99, 100)
    assert stat(RandomSampler(ds, num_samples=200)) == (100, 0, 99, 200)
    repeated, lo, hi, total = stat(RandomSampler(ds, num_samples=99))
    assert repeated == 0 and lo >= 0 and hi < 100 and total == 99
    assert stat(RandomSampler(ds, num_samples=101)) == (1, 0, 99, 101)


@pytest.mark.parametrize("replacement", [True, False])
def test_random_sampler_len(DataLoader: Any, replacement: bool) -> None:
    """test_dataloader.py: TestDataLoader.test_random_sampler_len_with_replacement
    and test_random_sampler_len_without_replacement (plus one epoch of the
    batch_size=6 loader)"""
    ds = port.CountingDataset(100)
    sampler = RandomSampler(ds, replacement=replacement, num_samples=105)
    assert len(DataLoader(ds, batch_size=1, sampler=sampler)) == 105
    loader = DataLoader(ds, batch_size=6, sampler=sampler)
    assert len(loader) == math.ceil(105 / 6)
    batches = [b.tolist() for b in loader]
    assert len(batches) == len(loader)
    assert sum(map(len, batches)) == 105


def test_duplicating_data_with_drop_last(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_duplicating_data_with_drop_last"""
    num_processes, num_batches = 4, 9
    data = torch.IntTensor(range(num_batches))
    scanned = []
    for rank in range(num_processes):
        sampler = DistributedSampler(data, num_processes, rank)
        loader = DataLoader(
            data,
            batch_size=num_batches // num_processes,
            drop_last=True,
            sampler=sampler,
        )
        for batch in loader:
            scanned += batch.tolist()
    assert len(scanned) == len(set(scanned)) == 8


def test_distributed_sampler_set_epoch(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_duplicating_data_with_drop_last
    (extended to shuffle=True: set_epoch() between epochs of the same
    loaders gives each epoch its order, the ranks together cover the data,
    and the same epoch gives the same order again)"""
    ds = port.CountingDataset(10)
    samplers = [
        DistributedSampler(ds, num_replicas=2, rank=r, shuffle=True, seed=0)
        for r in (0, 1)
    ]
    loaders = [
        DataLoader(ds, batch_size=None, sampler=s, num_workers=1) for s in samplers
    ]

    def epoch(e: int) -> list[list[int]]:
        for s in samplers:
            s.set_epoch(e)
        return [ints(loader) for loader in loaders]

    e0, e1, e0_again = epoch(0), epoch(1), epoch(0)
    for ranks in (e0, e1):
        assert sorted(ranks[0] + ranks[1]) == list(range(10))
    assert e0 == e0_again
    assert e0 != e1


SAMPLERS = {
    "random_replacement": lambda ds, g: RandomSampler(
        ds, num_samples=5, replacement=True, generator=g
    ),
    "random": lambda ds, g: RandomSampler(ds, replacement=False, generator=g),
    "weighted_replacement": lambda ds, g: WeightedRandomSampler(
        [0.1, 0.9, 0.4, 0.7, 3.0, 0.6], num_samples=5, replacement=True, generator=g
    ),
    "weighted": lambda ds, g: WeightedRandomSampler(
        [0.1, 0.9, 0.4, 0.7, 3.0, 0.6], num_samples=5, replacement=False, generator=g
    ),
    "subset": lambda ds, g: SubsetRandomSampler(range(10), generator=g),
}


@pytest.mark.parametrize("kind", list(SAMPLERS))
def test_sampler_reproducibility(DataLoader: Any, kind: str) -> None:
    """test_dataloader.py: TestDataLoader.test_sampler_reproducibility (through
    a loader with a worker: a seeded generator gives the same samples; with
    no generator, the same torch.manual_seed gives the same two epochs)"""
    ds = port.CountingDataset(100)

    def with_generator() -> list[int]:
        sampler = SAMPLERS[kind](ds, torch.Generator().manual_seed(42))
        return ints(DataLoader(ds, batch_size=None, sampler=sampler, num_workers=1))

    assert with_generator() == with_generator()

    loader = DataLoader(
        ds, batch_size=None, sampler=SAMPLERS[kind](ds, None), num_workers=1
    )
    torch.manual_seed(0)
    first = ints(loader) + ints(loader)
    torch.manual_seed(0)
    second = ints(loader) + ints(loader)
    assert first == second


SAMPLER_VARIANTS = [
    pytest.param({}, id="in-process"),
    pytest.param({"num_workers": 2}, id="workers"),
]


@pytest.mark.parametrize("kwargs", SAMPLER_VARIANTS)
def test_sampler(DataLoader: Any, td: Tensors, kwargs: dict[str, Any]) -> None:
    """test_dataloader.py: TestDataLoader.test_sampler (a range as sampler)"""
    loader = DataLoader(td.dataset, sampler=range(2, 12), batch_size=2, **kwargs)
    assert len(loader) == 5
    n = 0
    for i, (inp, _target) in enumerate(loader):
        assert len(inp) == 2
        assert torch.equal(inp, td.data[i * 2 + 2 : i * 2 + 4])
        n += 1
    assert n == 5


@pytest.mark.parametrize(
    "kwargs",
    [
        *SAMPLER_VARIANTS,
        pytest.param(
            {"num_workers": 2, "multiprocessing_context": "spawn"}, id="spawn"
        ),
    ],
)
def test_batch_sampler(DataLoader: Any, td: Tensors, kwargs: dict[str, Any]) -> None:
    """test_dataloader.py: TestDataLoader.test_batch_sampler (batches of 2 and
    3 in turn from a list of tuples)"""
    batches = []
    for i in range(0, 20, 5):
        batches.append(tuple(range(i, i + 2)))
        batches.append(tuple(range(i + 2, i + 5)))
    loader = DataLoader(td.dataset, batch_sampler=batches, **kwargs)
    assert len(loader) == 8
    n = 0
    for i, (inp, _target) in enumerate(loader):
        offset = i * 5 // 2
        size = 2 if i % 2 == 0 else 3
        assert len(inp) == size
        assert torch.equal(inp, td.data[offset : offset + size])
        n += 1
    assert n == 8


@pytest.mark.parametrize("num_workers", [0, 2])
def test_bulk_loading_nobatch(DataLoader: Any, num_workers: int) -> None:
    """test_dataloader.py: TestDataLoader.test_bulk_loading_nobatch (without
    the private _auto_collation and CUDA pinning)"""
    ds = port.BulkLoadingDataset(35)
    sampler = port.BulkLoadingSampler(ds, batch_size=4)
    loader = DataLoader(ds, num_workers=num_workers, batch_size=None, sampler=sampler)
    samples = list(loader)
    assert len(samples) == 9
    assert sorted(torch.cat(samples, 0).tolist()) == list(range(35))
