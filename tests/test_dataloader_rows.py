"""fastq.torch.DataLoader's workers writing each sample's rows into the slot
as it is fetched, where collate_fn is torch's default_collate (NOTE [ Rows
written as fetched ] in fastq/torch/_row_collate.py): the batches are
default_collate's bit for bit, default_collate's Python pass runs only to
learn the layout, and a sample that does not fit hands its batch back to
default_collate with nothing fetched twice."""

from __future__ import annotations

import multiprocessing
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.utils.data._utils.collate as torch_collate  # noqa: E402
from torch.utils.data import DataLoader as TorchLoader  # noqa: E402

from fastq.torch import DataLoader  # noqa: E402
from fastq.torch._row_collate import RowCollate  # noqa: E402
from fastq.torch._worker_side import CODEC  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(120)]


def _image(i: int, shape: tuple[int, ...] = (3, 6, 5)) -> Any:
    return np.random.default_rng(i).integers(0, 255, shape, dtype=np.uint8)


def _sample(kind: str, i: int) -> Any:
    image = _image(i)
    if kind == "pair":
        return image, np.int64(i)
    if kind == "dict":
        return {"pixels": image.astype(np.float32) / 7, "label": i, "w": float(i) / 3}
    if kind == "list":
        return [image, np.float16(i / 7), np.bool_(i % 2)]
    if kind == "bare":
        return image
    if kind == "nested":
        return {"a": (image, np.array(i, np.int32)), "b": {"c": np.complex64(i + 1j)}}
    if kind == "zero-d":
        return np.array(i, np.int16), np.array(i / 3)
    if kind == "uint":
        return image.astype(np.uint16) * 250, np.uint32(i)
    raise AssertionError(kind)


class Samples:
    def __init__(self, kind: str, n: int = 37) -> None:
        self.kind = kind
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return _sample(self.kind, i)


def _cloned(b: Any) -> Any:
    if isinstance(b, torch.Tensor):
        return b.clone()
    if isinstance(b, dict):
        return {k: _cloned(v) for k, v in b.items()}
    return type(b)(_cloned(v) for v in b)


def assert_same(got: Any, want: Any) -> None:
    assert type(got) is type(want)
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.numpy().tobytes() == want.numpy().tobytes()
    elif isinstance(want, dict):
        assert list(got) == list(want)
        for k in want:
            assert_same(got[k], want[k])
    else:
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert_same(g, w)


@pytest.mark.parametrize(
    "kind", ["pair", "dict", "list", "bare", "nested", "zero-d", "uint"]
)
def test_batches_are_default_collates_bit_for_bit(kind: str) -> None:
    want = [_cloned(b) for b in TorchLoader(Samples(kind), batch_size=5)]
    loader = DataLoader(Samples(kind), batch_size=5, num_workers=2)
    assert_same([_cloned(b) for b in loader], want)


def test_learns_only_a_layout_default_collate_makes_the_same() -> None:
    samples = [_sample("pair", i) for i in range(4)]
    assert RowCollate.learn(samples, torch_collate.default_collate(samples), CODEC)
    # A namedtuple, a string leaf, a tensor leaf: default_collate's own.
    from collections import namedtuple

    Pair = namedtuple("Pair", "x y")
    for odd in (
        [Pair(_image(i), i) for i in range(4)],
        [(_image(i), f"name{i}") for i in range(4)],
        [(torch.from_numpy(_image(i)), i) for i in range(4)],
        [(_image(i), True) for i in range(4)],
    ):
        assert RowCollate.learn(odd, torch_collate.default_collate(odd), CODEC) is None
    # A collated batch other than the rows': refused, whatever the samples.
    wrong = torch_collate.default_collate(samples)
    wrong[1] = wrong[1].to(torch.int32)
    assert RowCollate.learn(samples, wrong, CODEC) is None


class _Counted:
    """default_collate's Python pass, counted across the worker processes."""

    def __init__(self, count: Any) -> None:
        self.count = count
        self.inner = torch_collate.collate

    def __call__(self, batch: Any, **kw: Any) -> Any:
        with self.count.get_lock():
            self.count.value += 1
        return self.inner(batch, **kw)


def test_default_collate_runs_only_to_learn(monkeypatch: pytest.MonkeyPatch) -> None:
    count = multiprocessing.get_context("fork").Value("i", 0)
    monkeypatch.setattr(torch_collate, "collate", _Counted(count))
    loader = DataLoader(
        Samples("pair", 200),
        batch_size=5,
        num_workers=2,
        multiprocessing_context="fork",
    )
    want = [_cloned(b) for b in TorchLoader(Samples("pair", 200), batch_size=5)]
    with count.get_lock():
        count.value = 0
    got = [_cloned(b) for b in loader]
    assert_same(got, want)
    # Each worker's batch made before the ring and its first into a slot,
    # each a pass over the sample and one per field: 40 batches otherwise.
    assert 0 < count.value <= 2 * 2 * 3


class Changing:
    """Labels that turn from ints to floats at sample 23, an image of
    another shape at 31: default_collate's batches, and its error."""

    def __init__(self, odd_shape: bool = False) -> None:
        self.odd_shape = odd_shape
        self.calls = multiprocessing.get_context("fork").Value("i", 0)

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> Any:
        with self.calls.get_lock():
            self.calls.value += 1
        image = _image(i, (2, 3, 3) if self.odd_shape and i == 31 else (3, 6, 5))
        return image, (i if i < 23 else i + 0.5)


def test_a_sample_that_does_not_fit_leaves_its_batch_to_default_collate() -> None:
    want = [_cloned(b) for b in TorchLoader(Changing(), batch_size=4)]
    data = Changing()
    loader = DataLoader(
        data, batch_size=4, num_workers=2, multiprocessing_context="fork"
    )
    assert_same([_cloned(b) for b in loader], want)
    assert want[6][1].dtype == torch.float64  # the batch the change falls in
    assert data.calls.value == 40  # no sample fetched twice


def test_torchs_error_names_the_batch_a_misfit_falls_in() -> None:
    loader = DataLoader(
        Changing(odd_shape=True), batch_size=4, num_workers=1, timeout=60
    )
    it = iter(loader)
    for _ in range(7):
        next(it)
    with pytest.raises(RuntimeError, match="stack expects"):
        next(it)


class Failing(Samples):
    def __getitem__(self, i: int) -> Any:
        if i == 27:
            raise KeyError("sample 27 is missing")
        return super().__getitem__(i)


def test_a_failing_sample_is_named_as_before() -> None:
    loader = DataLoader(Failing("pair"), batch_size=5, num_workers=1, timeout=60)
    with pytest.raises(KeyError, match="batch 5, sample 27"):
        for _ in loader:
            pass


class RowsOfAnArray:
    """__getitems__ returns the batch as one array of rows, which
    default_collate takes as it takes a list of them."""

    def __init__(self) -> None:
        self.data = np.arange(30 * 4, dtype=np.float32).reshape(30, 4) / 7

    def __len__(self) -> int:
        return 30

    def __getitem__(self, i: int) -> Any:
        return self.data[i]

    def __getitems__(self, indices: list[int]) -> Any:
        return self.data[indices]


def test_an_array_from_getitems_is_default_collates() -> None:
    want = [_cloned(b) for b in TorchLoader(RowsOfAnArray(), batch_size=4)]
    loader = DataLoader(RowsOfAnArray(), batch_size=4, num_workers=2, timeout=60)
    assert_same([_cloned(b) for b in loader], want)


class RowsOfATensor(RowsOfAnArray):
    def __getitems__(self, indices: list[int]) -> Any:
        return torch.from_numpy(self.data[indices])


def test_a_tensor_from_getitems_gets_torchs_error() -> None:
    with pytest.raises(TypeError):
        next(iter(TorchLoader(RowsOfATensor(), batch_size=4)))
    loader = DataLoader(RowsOfATensor(), batch_size=4, num_workers=1, timeout=60)
    with pytest.raises(TypeError, match="must be tuple of Tensors"):
        next(iter(loader))


class Refilled:
    """One buffer refilled for every sample (or a ring of two): torch's
    default_collate stacks its last contents in every row."""

    def __init__(self, ring: int) -> None:
        self.buffers = [np.zeros((2, 3), np.int32) for _ in range(ring)]

    def __len__(self) -> int:
        return 20

    def __getitem__(self, i: int) -> Any:
        buf = self.buffers[i % len(self.buffers)]
        buf[:] = i
        return buf[:], np.int64(i)


@pytest.mark.parametrize("ring", [1, 2])
def test_a_refilled_buffer_gives_default_collates_rows(ring: int) -> None:
    want = [
        _cloned(b) for b in TorchLoader(Refilled(ring), batch_size=4, num_workers=2)
    ]
    loader = DataLoader(Refilled(ring), batch_size=4, num_workers=2)
    assert_same([_cloned(b) for b in loader], want)
    assert int(want[1][0][0, 0, 0]) == 7 - (ring - 1)  # torch's, not row 0's 4


def test_a_sample_drawn_twice_keeps_its_contents() -> None:
    sampler = [[0, 3, 3, 5], [7, 7, 7, 1], [2, 2, 9, 9]] * 3
    want = [_cloned(b) for b in TorchLoader(Samples("pair"), batch_sampler=sampler)]
    loader = DataLoader(Samples("pair"), batch_sampler=sampler, num_workers=2)
    assert_same([_cloned(b) for b in loader], want)
