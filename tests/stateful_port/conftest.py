"""The fixture of the port of torchdata's test_state_dict.py: the class
under test (tests skip themselves without torch or torchdata)."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="module")
def StatefulDataLoader() -> Any:
    """The class under test."""
    import torch
    from stateful_support import AGAINST

    if AGAINST == "torchdata":
        sdl = pytest.importorskip("torchdata.stateful_dataloader")
        return sdl.StatefulDataLoader
    from fastq.torch import StatefulDataLoader as FastqStatefulDataLoader

    assert issubclass(FastqStatefulDataLoader, torch.utils.data.DataLoader)
    return FastqStatefulDataLoader
