"""A training script's dataset module: it imports torch, so every worker
that has to import it again (spawn, the normal fork server) pays for torch."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch.utils.data

SAMPLE_SHAPE = (3, 32, 32)


class Images(torch.utils.data.Dataset[Any]):
    """Small float32 images: making one costs microseconds, so the time to
    the first batch is the workers' start."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return np.full(SAMPLE_SHAPE, i, dtype=np.float32), np.int64(i)
