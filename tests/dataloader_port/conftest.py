"""The fixtures of the port of PyTorch's test/test_dataloader.py (each test
module skips itself without torch, so torch is imported here only once a
fixture runs)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from port_support import Tensors


@pytest.fixture(scope="module")
def DataLoader() -> Any:
    """The class under test."""
    import torch
    from port_support import AGAINST

    if AGAINST == "torch":
        return torch.utils.data.DataLoader
    from fastq.torch import DataLoader as FastqDataLoader

    assert issubclass(FastqDataLoader, torch.utils.data.DataLoader)
    return FastqDataLoader


@pytest.fixture
def td() -> Tensors:
    """100 random samples of shape (2, 3, 5); labels 0..49 permuted, twice."""
    import torch
    from port_support import Tensors
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(0)
    data = torch.randn(100, 2, 3, 5, generator=g)
    labels = torch.randperm(50, generator=g).repeat(2)
    return Tensors(data, labels, TensorDataset(data, labels))
