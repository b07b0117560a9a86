"""Module-level map-style datasets for the torch tests: picklable under
spawn and forkserver, and torch-free so workers stay light."""

from __future__ import annotations

from typing import Any

import numpy as np

IMAGE_SHAPE = (3, 6, 5)


def image(i: int) -> np.ndarray[Any, Any]:
    """Sample i's image: every byte depends on i, so any mix-up shows."""
    base = np.arange(np.prod(IMAGE_SHAPE), dtype=np.int64).reshape(IMAGE_SHAPE)
    return ((base * 37 + i * 7919) % 253).astype(np.uint8)


class Images:
    """Sample i = (image(i), i, i / 2): checkable bit for bit."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[Any, ...]:
        return image(i), np.int64(i), np.float32(i) / 2


class DictImages(Images):
    def __getitem__(self, i: int) -> dict[str, Any]:  # type: ignore[override]
        return {"image": image(i), "label": np.int64(i)}


class Rows(Images):
    """A single array per sample."""

    def __getitem__(self, i: int) -> Any:
        return np.full(4, i, dtype=np.float64)


class Indices(Images):
    """Sample i is i: what the sharding tests record."""

    def __getitem__(self, i: int) -> Any:
        return np.int64(i)


class Datetimes(Images):
    """A dtype numpy has and torch has not (a fixed-size numeric one: text
    is refused earlier, when the spec is inferred)."""

    def __getitem__(self, i: int) -> Any:
        return np.array([i, i + 1], dtype="datetime64[s]")


class Bulk:
    """`n` rows of `row_bytes` bytes, filled straight into the slot."""

    def __init__(self, n: int, row_bytes: int) -> None:
        self.n = n
        self.row_bytes = row_bytes

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return np.full(self.row_bytes, i % 251, dtype=np.uint8)

    def fill_batch(self, indices: np.ndarray[Any, Any], out: Any) -> None:
        out[:] = (indices % 251).astype(np.uint8)[:, None]


def expected(indices: Any) -> tuple[Any, ...]:
    idx = np.asarray(indices, dtype=np.int64)
    return (
        np.stack([image(int(i)) for i in idx]),
        idx,
        idx.astype(np.float32) / 2,
    )
