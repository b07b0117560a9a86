"""PyTorch's test/test_dataloader.py, ported (port_support.py says how):
len, arguments and attributes."""

from __future__ import annotations

import typing
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from port_support import (  # noqa: E402
    START_METHODS,
    Tensors,
    fastq_default,
    ints,
    migration,
)
from torch.utils.data import (  # noqa: E402
    TensorDataset,
    random_split,
)
from torch_helpers import dataloader_port_data as port  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(60)]


def test_len(DataLoader: Any, td: Tensors) -> None:
    """test_dataloader.py: TestDataLoader.test_len"""
    for batch_size, expected in ((2, 50), (3, 34)):
        loader = DataLoader(td.dataset, batch_size=batch_size)
        assert len(loader) == expected
        assert sum(1 for _ in loader) == expected


@pytest.mark.parametrize("num_workers", [0, 2])
def test_len_empty_dataset(DataLoader: Any, num_workers: int) -> None:
    """test_dataloader.py: TestDataLoader.test_len (extended to an empty
    dataset: len 0 and an empty epoch, twice)"""
    loader = DataLoader(
        TensorDataset(torch.empty(0, 3)), batch_size=2, num_workers=num_workers
    )
    assert len(loader) == 0
    assert list(loader) == []
    assert list(loader) == []


def test_iterabledataset_len(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_iterabledataset_len"""
    for batch_size, drop_last, expected in (
        (1, False, 10),
        (1, True, 10),
        (2, False, 5),
        (2, True, 5),
        (3, False, 4),
        (3, True, 3),
    ):
        loader = DataLoader(
            port.SizedIterableDataset(), batch_size=batch_size, drop_last=drop_last
        )
        assert len(loader) == expected, (batch_size, drop_last)


def test_growing_dataset(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_growing_dataset"""
    dataset = [torch.ones(4) for _ in range(4)]
    loader_seq = DataLoader(dataset, shuffle=False)
    loader_shuffle = DataLoader(dataset, shuffle=True)
    dataset.append(torch.ones(4))
    assert len(loader_seq) == 5
    assert len(loader_shuffle) == 5


@pytest.mark.parametrize(
    "persistence",
    [
        pytest.param(
            {},
            id="default",
            marks=migration(
                "workers persist by default, so they keep the dataset copy of "
                "their first epoch",
                condition=fastq_default("persistent_workers") is True,
            ),
        ),
        pytest.param({"persistent_workers": False}, id="transient"),
    ],
)
def test_growing_dataset_between_epochs(
    DataLoader: Any, persistence: dict[str, Any]
) -> None:
    """test_dataloader.py: TestDataLoader.test_growing_dataset (extended: the
    next epoch reads the new length and loads the new sample)"""
    dataset = [torch.full((4,), float(i)) for i in range(4)]
    loader = DataLoader(dataset, num_workers=1, **persistence)
    assert [int(b[0, 0]) for b in loader] == [0, 1, 2, 3]
    dataset.append(torch.full((4,), 4.0))
    assert len(loader) == 5
    assert [int(b[0, 0]) for b in loader] == [0, 1, 2, 3, 4]


def test_splits_indexing_type(DataLoader: Any) -> None:
    """test_dataloader.py: TestDatasetRandomSplit.test_splits_indexing_type
    (the dataset's __getitem__ gets Python ints, through random_split's
    Subset and directly)"""
    dataset = port.IntKeyDataset([1, 2, 3, 4, 5])
    for lengths in ([5], [1.0]):
        subset = random_split(dataset, lengths)[0]
        assert sorted(ints(DataLoader(subset))) == [1, 2, 3, 4, 5]
    assert ints(DataLoader(dataset)) == [1, 2, 3, 4, 5]


def test_invalid_assign_after_init(DataLoader: Any, td: Tensors) -> None:
    """test_dataloader.py: TestDataLoader.test_invalid_assign_after_init"""
    loader = DataLoader(td.dataset)
    for attr in ("batch_size", "sampler", "batch_sampler", "drop_last", "dataset"):
        with pytest.raises(ValueError):
            setattr(loader, attr, {})


def test_invalid_ctor_args_combinations(DataLoader: Any, td: Tensors) -> None:
    """test_dataloader.py: TestDataLoader.test_invalid_ctor_args_combinations"""
    ds = td.dataset
    with pytest.raises(ValueError, match="num_workers"):
        DataLoader(ds, num_workers=-1)
    with pytest.raises(ValueError, match="timeout"):
        DataLoader(ds, timeout=-1)
    with pytest.raises(ValueError, match="drop_last"):
        DataLoader(ds, batch_size=None, drop_last=True)

    with pytest.raises(ValueError, match="num_workers"):
        DataLoader(ds, num_workers=0, multiprocessing_context=START_METHODS[-1])
    with pytest.raises(ValueError, match="multiprocessing_context"):
        DataLoader(ds, num_workers=1, multiprocessing_context="bad")
    with pytest.raises(TypeError, match="multiprocessing_context"):
        DataLoader(ds, num_workers=1, multiprocessing_context=object())

    sampler = torch.utils.data.SequentialSampler(ds)
    batch_sampler = torch.utils.data.BatchSampler(sampler, 3, False)
    with pytest.raises(ValueError, match="shuffle"):
        DataLoader(ds, batch_size=11, sampler=sampler, shuffle=True)
    with pytest.raises(ValueError, match="shuffle"):
        DataLoader(ds, batch_sampler=batch_sampler, sampler=sampler, shuffle=True)
    with pytest.raises(ValueError, match="shuffle"):
        DataLoader(ds, batch_sampler=batch_sampler, sampler=sampler, shuffle=3)
    for kwargs in ({"batch_size": 11}, {"shuffle": True}, {"drop_last": True}):
        with pytest.raises(ValueError, match="batch_sampler"):
            DataLoader(ds, batch_sampler=batch_sampler, **kwargs)
    with pytest.raises(ValueError, match="batch_sampler"):
        DataLoader(ds, drop_last=3, batch_sampler=batch_sampler)

    iterable = port.CountingIterableDataset(20)
    for kwargs, word in (
        ({"shuffle": True}, "shuffle"),
        ({"shuffle": 3}, "shuffle"),
        ({"sampler": torch.utils.data.SequentialSampler(iterable)}, "sampler"),
        ({"sampler": 3}, "sampler"),
        (
            {
                "batch_sampler": torch.utils.data.BatchSampler(
                    torch.utils.data.SequentialSampler(iterable), 3, False
                )
            },
            "batch_sampler",
        ),
        ({"batch_sampler": 3}, "batch_sampler"),
    ):
        with pytest.raises(ValueError, match=word):
            DataLoader(iterable, **kwargs)


def test_typing(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_typing (the class takes a type
    argument, so DataLoader[list[torch.Tensor]] is an annotation)"""

    class SomeDatasetClass(torch.utils.data.Dataset[list[torch.Tensor]]):
        pass

    def create_dataloader(is_train: bool) -> DataLoader[list[torch.Tensor]]:
        raise NotImplementedError

    alias = DataLoader[list[torch.Tensor]]
    assert typing.get_origin(alias) is DataLoader
    assert typing.get_args(alias) == (list[torch.Tensor],)
    hints = typing.get_type_hints(create_dataloader, localns={"DataLoader": DataLoader})
    assert hints["return"] == alias


def test_excessive_thread_creation_warning(DataLoader: Any, td: Tensors) -> None:
    """test_dataloader.py: TestDataLoader.test_excessive_thread_creation_warning
    (warned when the loader is made, before any worker starts)"""
    with pytest.warns(UserWarning, match="excessive worker creation"):
        DataLoader(td.dataset, batch_size=2, num_workers=1000)
