"""Batch shapes and the producers every transport runs, so each transport
pays the same producer work per batch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np


@dataclass(frozen=True)
class Workload:
    """A batch of `rows` rows; each field is (name, row shape, dtype)."""

    name: str
    rows: int
    fields: tuple[tuple[str, tuple[int, ...], str], ...]

    @property
    def batch_bytes(self) -> int:
        return sum(
            self.rows * int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize
            for _, shape, dt in self.fields
        )

    def describe(self) -> str:
        parts = [f"{self.rows} x {'x'.join(map(str, s)) or 'scalar'} {dt}"
                 for _, s, dt in self.fields]
        return " + ".join(parts) + f" = {self.batch_bytes / 1e6:.2f} MB/batch"

    def template(self, seed: int) -> tuple[np.ndarray[Any, Any], ...]:
        """One batch of random content, made once per producer."""
        rng = np.random.default_rng(seed)
        out = []
        for _, shape, dt in self.fields:
            full = (self.rows, *shape)
            if np.dtype(dt).kind == "f":
                out.append(rng.random(full, dtype=np.float32).astype(dt))
            else:
                out.append(rng.integers(0, 100, full).astype(dt))
        return tuple(out)


def _labels() -> tuple[str, tuple[int, ...], str]:
    return ("label", (), "int64")


WORKLOADS = {
    w.name: w
    for w in (
        Workload("small", 256, (("x", (32,), "float32"), _labels())),
        Workload("medium", 64, (("image", (3, 64, 64), "uint8"),)),
        Workload("imagenet", 128, (("image", (3, 224, 224), "uint8"), _labels())),
        Workload("float", 32, (("image", (3, 224, 224), "float32"),)),
        Workload("huge", 256, (("image", (3, 224, 224), "float32"),)),
    )
}
DEFAULT_WORKLOAD = "imagenet"
IMAGENET_TRAIN_SAMPLES = 1_281_167


def stamp(batch: tuple[np.ndarray[Any, Any], ...], n: int) -> None:
    """Marks a batch with its number (the per-batch producer work that
    makes every batch distinct; the consumer checks it)."""
    batch[0].reshape(-1).view(np.uint8)[:8] = np.frombuffer(
        np.int64(n).tobytes(), np.uint8
    )


def read_stamp(batch_first_field: np.ndarray[Any, Any]) -> int:
    return int(batch_first_field.reshape(-1).view(np.uint8)[:8].view(np.int64)[0])


class BatchSource:
    """Callable source: each call yields the same template batch, stamped
    with a running number, forever (the get_batch / GeneratorEnqueuer
    pattern)."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload

    def __call__(self) -> Iterator[tuple[np.ndarray[Any, Any], ...]]:
        batch = self.workload.template(seed=0)
        n = 0
        while True:
            stamp(batch, n)
            n += 1
            yield batch


class SampleDataset:
    """Map-style source: sample i is row i % rows of a template batch, with
    its first field stamped; fastq collates rows straight into the slot."""

    def __init__(self, workload: Workload, length: int = IMAGENET_TRAIN_SAMPLES) -> None:
        self.workload = workload
        self.length = length
        self._rows: list[tuple[np.ndarray[Any, Any], ...]] | None = None

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[np.ndarray[Any, Any], ...]:
        if self._rows is None:
            t = self.workload.template(seed=0)
            self._rows = [tuple(f[r] for f in t) for r in range(self.workload.rows)]
        return self._rows[i % self.workload.rows]
