"""PyTorch's test/test_dataloader.py, ported (port_support.py says how):
collation and conversion."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from port_support import (  # noqa: E402
    PERSISTENT,
    assert_like,
    raises_in_loop,
)
from torch.utils.data import (  # noqa: E402
    TensorDataset,
    default_collate,
    default_convert,
)
from torch_helpers import dataloader_port_data as port  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(60)]


def test_numpy(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_numpy"""
    batch = next(iter(DataLoader(port.NumpyDataset(), batch_size=12)))
    assert isinstance(batch, torch.Tensor)
    assert batch.dtype == torch.float64
    assert batch.shape == (12, 2, 3, 4)
    assert torch.equal(batch[5], torch.full((2, 3, 4), 5.0, dtype=torch.float64))


NUMPY_SCALARS = {
    np.float64: torch.float64,
    np.float32: torch.float32,
    np.float16: torch.float16,
    np.int64: torch.int64,
    np.int32: torch.int32,
    np.int16: torch.int16,
    np.int8: torch.int8,
    np.uint8: torch.uint8,
}


def test_numpy_scalars(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_numpy_scalars"""
    for dtype, expected in NUMPY_SCALARS.items():
        batch = next(iter(DataLoader(port.ScalarDataset(dtype), batch_size=2)))
        assert isinstance(batch, torch.Tensor), dtype
        assert batch.dtype == expected, dtype
        assert batch.tolist() == [0, 1], dtype


def test_default_collate_dtype(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_default_collate_dtype (collated
    in a worker: Python numbers become tensors of their dtype, strings stay
    a list)"""
    for samples, dtype in (
        ([1, 2, -1], torch.int64),
        ([1.1, 2.3, -0.9], torch.float64),
        ([True, False], torch.bool),
        (["a", "b", "c"], None),
    ):
        loader = DataLoader(
            port.ListDataset(samples), batch_size=len(samples), num_workers=1
        )
        (batch,) = list(loader)
        if dtype is None:
            assert type(batch) is list
            assert batch == samples
        else:
            assert isinstance(batch, torch.Tensor), samples
            assert batch.dtype == dtype, samples
            assert batch.tolist() == samples


def test_default_collate_mapping_keep_type(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_default_collate_mapping_keep_type
    (collated in a worker)"""
    samples = [port.CustomDict({"a": 1, "b": 2}), port.CustomDict({"a": 3, "b": 4})]
    loader = DataLoader(port.ListDataset(samples), batch_size=2, num_workers=1)
    (batch,) = list(loader)
    assert type(batch) is port.CustomDict
    assert sorted(batch) == ["a", "b"]
    assert batch["a"].tolist() == [1, 3]
    assert batch["b"].tolist() == [2, 4]


def test_default_collate_sequence_keep_type(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_default_collate_sequence_keep_type
    (collated in a worker)"""
    samples = [port.CustomList([1, 2, 3]), port.CustomList([4, 5, 6])]
    loader = DataLoader(port.ListDataset(samples), batch_size=2, num_workers=1)
    (batch,) = list(loader)
    assert type(batch) is port.CustomList
    assert [t.tolist() for t in batch] == [[1, 4], [2, 5], [3, 6]]


def test_default_collate_sequence_dont_keep_type(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_default_collate_sequence_dont_keep_type
    (collated in a worker: range samples give a list)"""
    loader = DataLoader(
        port.ListDataset([range(2), range(2)]), batch_size=2, num_workers=1
    )
    (batch,) = list(loader)
    assert type(batch) is list
    assert [t.tolist() for t in batch] == [[0, 0], [1, 1]]


def test_default_collate_bad_numpy_types(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_default_collate_bad_numpy_types
    (batches of string and object arrays: collate's TypeError reaches the
    loop as a TypeError)"""
    for sample in (
        np.array([[["a", "b", "c"]]]),
        np.array([1, "x", None], dtype=object),
        np.array([[[1, "x", None]]], dtype=object),
    ):
        loader = DataLoader(
            port.ListDataset([sample, sample]), batch_size=2, num_workers=1
        )
        with raises_in_loop(TypeError):
            next(iter(loader))


def test_default_collate_bad_sequence_type(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoader.test_default_collate_bad_sequence_type
    (lists of unequal length, either way round: collate's RuntimeError
    reaches the loop)"""
    for samples in ([["X"], ["X", "X"]], [["X", "X"], ["X"]]):
        loader = DataLoader(port.ListDataset(samples), batch_size=2, num_workers=1)
        with raises_in_loop(RuntimeError, match="equal size"):
            next(iter(loader))


def test_string_dataset_shuffle(DataLoader: Any) -> None:
    """test_dataloader.py: TestStringDataLoader.test_shuffle_pin_memory (without
    pin_memory: (str, int) samples give default_collate's tuple of str and a
    tensor)"""
    loader = DataLoader(port.StringDataset(), batch_size=2, shuffle=True, num_workers=2)
    seen = []
    for batch in loader:
        # default_collate keeps a batch of str as the sequence it is given:
        # here the tuple that transposing (str, int) samples makes
        s, n = batch
        reference = default_collate([port.StringDataset()[i] for i in n.tolist()])
        assert_like(batch, reference)
        assert s == reference[0]
        seen += s
    assert sorted(seen) == list("12345")


@PERSISTENT
def test_dict_sequential_batch(DataLoader: Any, persistent_workers: bool) -> None:
    """test_dataloader.py: TestDictDataLoader.test_sequential_batch"""
    kwargs: dict[str, Any] = {"batch_size": 2, "shuffle": False}
    if persistent_workers:
        kwargs.update(persistent_workers=True, num_workers=1)
    loader = DataLoader(port.DictDataset(), **kwargs)
    n = 0
    for i, sample in enumerate(loader):
        idx = i * 2
        assert set(sample) == {"a_tensor", "another_dict"}
        assert set(sample["another_dict"]) == {"a_number"}
        t = sample["a_tensor"]
        assert t.shape == (2, 4, 2)
        assert (t[0] == idx).all() and (t[1] == idx + 1).all()
        num = sample["another_dict"]["a_number"]
        assert isinstance(num, torch.Tensor) and num.shape == (2,)
        assert num.tolist() == [idx, idx + 1]
        n += 1
    assert n == 2


def test_dataloader_with_namedtuple(DataLoader: Any) -> None:
    """test_dataloader.py: TestNamedTupleDataLoader.test_dataloader_with_namedtuple
    (without pin_memory)"""
    ds = port.NamedTupleDataset()
    collated = default_collate([ds[0], ds[1]])
    for i, batch in enumerate(DataLoader(ds, batch_size=2)):
        assert isinstance(batch, port.Batch)
        assert isinstance(batch.data, port.Data)
        assert isinstance(batch.data.positive, torch.Tensor)
        assert_like(batch, collated)
        assert batch.data.positive.tolist() == [2 * i, 2 * i + 1]
        assert list(batch.label) == [str(2 * i), str(2 * i + 1)]
    converted = default_convert(ds[0])
    for i, batch in enumerate(DataLoader(ds, batch_size=None)):
        assert isinstance(batch, port.Batch)
        assert isinstance(batch.data, port.Data)
        assert not isinstance(batch.data.positive, torch.Tensor)
        assert_like(batch, converted)
        assert batch.data == (i, -i) and batch.label == str(i)


@pytest.mark.parametrize("num_workers", [0, 1])
def test_custom_batch(DataLoader: Any, num_workers: int) -> None:
    """test_dataloader.py: TestCustomPinFn.test_custom_batch_pin and
    test_custom_batch_pin_worker (without pin_memory: a custom collate_fn's
    objects arrive as they are)"""
    inps = torch.arange(10 * 5, dtype=torch.float32).view(10, 5)
    tgts = torch.arange(10 * 5, dtype=torch.float32).view(10, 5)
    packed = torch.nn.utils.rnn.PackedSequence
    for collate_fn, elem_cls in (
        (port.collate_wrapper, port.SimpleCustomBatch),
        (port.collate_into_packed_sequence, packed),
        (port.collate_into_packed_sequence_batch_first, packed),
    ):
        loader = DataLoader(
            TensorDataset(inps, tgts),
            batch_size=2,
            collate_fn=collate_fn,
            num_workers=num_workers,
        )
        n = 0
        for i, sample in enumerate(loader):
            assert isinstance(sample, elem_cls), collate_fn.__name__
            if elem_cls is port.SimpleCustomBatch:
                assert torch.equal(sample.inp, inps[2 * i : 2 * i + 2])
                assert torch.equal(sample.tgt, tgts[2 * i : 2 * i + 2])
            n += 1
        assert n == 5


def test_nested_tensor_multiprocessing(DataLoader: Any) -> None:
    """test_dataloader.py: TestDataLoaderDeviceType.test_nested_tensor_multiprocessing
    (CPU, the default context)"""
    g = torch.Generator().manual_seed(0)
    dataset = [
        torch.nested.nested_tensor([torch.randn(5, generator=g)]) for _ in range(10)
    ]
    loader = DataLoader(
        dataset, batch_size=1, num_workers=2, collate_fn=port.clone_collate
    )
    n = 0
    for i, batch in enumerate(loader):
        assert batch[0].is_nested
        assert torch.equal(batch[0].unbind()[0], dataset[i].unbind()[0])
        n += 1
    assert n == 10

    loader = DataLoader(dataset, batch_size=1, num_workers=2)
    with raises_in_loop(RuntimeError, match="not currently supported by the default"):
        next(iter(loader))
