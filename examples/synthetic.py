"""A synthetic image dataset for the examples: numpy only, so the worker
processes that load it never import torch."""

from __future__ import annotations

from typing import Any

import numpy as np


class SyntheticImages:
    """Image i shows class i % classes: that class's fixed pattern, shifted
    and mixed with noise drawn from i (so every epoch sees the same data).
    Defined at module level so that fastq's worker processes can load it."""

    def __init__(
        self, n: int, classes: int = 10, size: int = 32, seed: int = 0
    ) -> None:
        self.n = n
        self.classes = classes
        rng = np.random.default_rng(seed)
        self.patterns = rng.integers(0, 256, (classes, 3, size, size)).astype(np.int16)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.ndarray[Any, Any], np.int64]:
        label = i % self.classes
        rng = np.random.default_rng(i)
        dy, dx = rng.integers(-3, 4, size=2)
        image = np.roll(self.patterns[label], (dy, dx), axis=(1, 2))
        noise = rng.integers(0, 256, image.shape, dtype=np.int16)
        image = (image * 3 + noise * 2) // 5
        return image.astype(np.uint8), np.int64(label)
