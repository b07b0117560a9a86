"""fastq.torch.DataLoader's default collate in its workers: samples stacked
straight into the slot by fastq's own copy (NOTE [ Stacking with numpy ] in
fastq/torch/_worker_side.py), bit for bit what torch's default_collate
makes, and torch's own path, with torch's errors, wherever that copy cannot
stand in for it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader as TorchLoader  # noqa: E402

from fastq._layout._rows import stack_rows  # noqa: E402
from fastq.torch import DataLoader  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.timeout(90)]


class Samples:
    """Sample i of one kind: made in the worker, the same on every run."""

    def __init__(self, kind: str, n: int = 24) -> None:
        self.kind = kind
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        rng = np.random.default_rng(i)
        image = rng.integers(0, 255, (3, 20, 24), dtype=np.uint8)
        if self.kind == "numpy":
            return image, np.int64(i), np.float32(i / 3)
        if self.kind == "strided":  # views whose rows are not contiguous
            return image[:, ::2, 1::3], image.T
        if self.kind == "tensors":
            return torch.from_numpy(image).float() / 255, torch.tensor(i)
        if self.kind == "bfloat16":  # a dtype numpy lacks
            return torch.from_numpy(image).to(torch.bfloat16)
        if self.kind == "zero-d":
            return np.array(i, dtype=np.int32), np.array(float(i))
        if self.kind == "big-endian":
            return image.astype(">i4")
        if self.kind == "ragged":  # torch's own error, raised at its batch
            return np.zeros((i % 3 + 1, 2), np.float32)
        raise AssertionError(self.kind)


def batches(loader: Any) -> list[Any]:
    return [
        [x.clone() for x in b] if isinstance(b, (list, tuple)) else b.clone()
        for b in loader
    ]


def assert_same(got: Any, want: Any) -> None:
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got, want)
        return
    assert type(got) is type(want) and len(got) == len(want)
    for g, w in zip(got, want):
        assert_same(g, w)


@pytest.mark.parametrize("kind", ["numpy", "strided", "tensors", "bfloat16", "zero-d"])
def test_batches_are_torchs_default_collate_bit_for_bit(kind: str) -> None:
    want = batches(TorchLoader(Samples(kind), batch_size=5))
    loader = DataLoader(Samples(kind), batch_size=5, num_workers=2)
    assert_same(batches(loader), want)


@pytest.mark.parametrize(
    ("kind", "error", "match"),
    [
        ("ragged", RuntimeError, "stack expects each tensor to be equal"),
        ("big-endian", ValueError, "byte order"),
    ],
)
def test_what_torch_refuses_raises_torchs_error(
    kind: str, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        list(TorchLoader(Samples(kind), batch_size=4))
    loader = DataLoader(Samples(kind), batch_size=4, num_workers=1)
    with pytest.raises(error, match=match):
        list(loader)


def test_stack_rows_writes_the_rows_or_refuses_and_writes_nothing() -> None:
    rows = [np.full((4, 5), j, np.int16) for j in range(3)]
    out = np.zeros((3, 4, 5), np.int16)
    assert stack_rows(out, rows)
    assert np.array_equal(out, np.stack(rows))
    fresh = np.zeros_like(out)
    refused = [
        [rows[0], rows[1]],  # too few rows for out
        [rows[0], rows[1], rows[2].astype(np.int32)],  # another dtype
        [rows[0], rows[1], rows[2][:, :4]],  # another shape
        [rows[0], rows[1], np.asfortranarray(np.ones((4, 5), np.int16))[:, :]],
        [rows[0], rows[1], rows[2].view(np.recarray)],  # not an exact ndarray
    ]
    for case in refused[:3] + refused[4:]:
        assert not stack_rows(fresh, case)
        assert not fresh.any()
    strided = [r.T.copy().T for r in rows]  # Fortran-ordered rows
    assert not stack_rows(fresh, strided)
    assert not fresh.any()
