"""A training script's dataset module: it imports torch, so every worker
that has to import it again (spawn, the normal fork server) pays for torch."""

from __future__ import annotations

import time
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


PHOTO_SHAPE = (3, 224, 224)


class SlowPhotos(torch.utils.data.Dataset[Any]):
    """ImageNet-sized uint8 images, each taking 3 ms (a sleep: a decode
    that waits on I/O), so that a batch of 128 takes 0.4 s of its worker
    and its slot holds 19 MB: the first batch is one batch's work plus the
    workers' start, if nothing else (a large ring's making) is on its way."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        time.sleep(0.003)
        return np.full(PHOTO_SHAPE, i % 251, dtype=np.uint8)
