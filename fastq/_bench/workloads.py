"""Batch shapes, and the producer every transport runs, so that each one pays
exactly the same producer work per batch."""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Arrays = tuple[np.ndarray[Any, Any], ...]

# The stamp: batch number and hand-over time (CLOCK_MONOTONIC, the clock
# time.perf_counter_ns reads on Linux, shared by every process) in the first
# 16 bytes of the first field of row 0.
STAMP_BYTES = 16


@dataclass(frozen=True)
class Workload:
    """A batch of `rows` rows; each field is (name, row shape, dtype).

    `compute` workloads make every sample with real work instead of
    stamping a prepared template: "augment" (numpy crop, flip, colour
    jitter) or "decode" (inflating a compressed image, as PNG does).
    """

    name: str
    rows: int
    fields: tuple[tuple[str, tuple[int, ...], str], ...]
    compute: str = ""
    note: str = ""

    @property
    def row_bytes(self) -> int:
        return sum(
            int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize
            for _, shape, dt in self.fields
        )

    @property
    def batch_bytes(self) -> int:
        return self.rows * self.row_bytes

    def describe(self) -> str:
        parts = [
            f"{self.rows} x {dt}[{','.join(map(str, s))}]"
            if s
            else f"{self.rows} x {dt}"
            for _, s, dt in self.fields
        ]
        return " + ".join(parts) + f" = {self.batch_bytes / 1e6:.3g} MB/batch"

    def empty(self) -> Arrays:
        return tuple(np.empty((self.rows, *s), dt) for _, s, dt in self.fields)


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
        Workload(
            "compute",
            32,
            (("image", (3, 224, 224), "uint8"), _labels()),
            compute="augment",
            note="per sample: random-resized crop of a 256x256 image to 224, "
            "flip, colour jitter in float32, back to uint8",
        ),
        Workload(
            "decode",
            32,
            (("image", (3, 224, 224), "uint8"), _labels()),
            compute="decode",
            note="per sample: zlib-inflate a 3x224x224 image (deflate level 6, "
            "PNG's codec; zlib lets go of the GIL while it inflates)",
        ),
    )
}
SHAPES = ("small", "medium", "imagenet", "float", "huge")
DEFAULT_WORKLOAD = "imagenet"
# Map-style datasets are as long as ImageNet's training set: loaders that
# build an epoch's index array (fastq does) pay for that, as they would.
DATASET_LENGTH = 1_281_167


def stamp(first: np.ndarray[Any, Any], n: int, t_ns: int) -> None:
    """Writes batch number `n` and hand-over time `t_ns` into the first 16
    bytes of `first` (the first field of a batch, or of its row 0)."""
    head = first.reshape(-1).view(np.uint8)[:STAMP_BYTES].view(np.int64)
    head[0] = n
    head[1] = t_ns


def read_stamp(first: Any) -> tuple[int, int]:
    """(batch number, hand-over time) of a batch's first field: the one read
    every consumer does, so it touches the batch without copying it."""
    head = memoryview(first).cast("B")[:STAMP_BYTES]
    return (
        int.from_bytes(head[:8], "little", signed=True),
        int.from_bytes(head[8:], "little", signed=True),
    )


# --------------------------------------------------------- compute workload

_SOURCE_SIDE = 256
_SOURCE_IMAGES = 16


def _source_images(rng: np.random.Generator) -> np.ndarray[Any, Any]:
    return rng.integers(
        0, 256, (_SOURCE_IMAGES, 3, _SOURCE_SIDE, _SOURCE_SIDE), dtype=np.uint8
    )


def _compressed_images(rng: np.random.Generator) -> list[bytes]:
    """Images that compress as photographs roughly do (smooth gradients
    with noise: about 2:1), deflated once."""
    side = 224
    ramp = np.add.outer(np.arange(side), np.arange(side)) // 2
    out = []
    for _ in range(_SOURCE_IMAGES):
        noise = rng.integers(0, 24, (3, side, side))
        image = ((ramp[None] + rng.integers(0, 256, (3, 1, 1)) + noise) % 256).astype(
            np.uint8
        )
        out.append(zlib.compress(image.tobytes(), 6))
    return out


def decode(blobs: list[bytes], i: int, out: np.ndarray[Any, Any]) -> None:
    """Sample i of the decode workload, inflated into `out`."""
    raw = zlib.decompress(blobs[i % len(blobs)])
    out[...] = np.frombuffer(raw, np.uint8).reshape(out.shape)


def augment(images: np.ndarray[Any, Any], i: int, out: np.ndarray[Any, Any]) -> None:
    """Sample i of the compute workload, written into `out` (3 x side x side
    uint8): the usual per-sample work of an image pipeline, a few
    milliseconds of numpy. A random-resized crop (35-100% of the area, aspect
    3/4 to 4/3, nearest-neighbour resize by gathering rows and columns), a
    random horizontal flip, and brightness, contrast and saturation jitter in
    float32."""
    rng = np.random.default_rng(i)
    side = out.shape[-1]
    area = _SOURCE_SIDE * _SOURCE_SIDE * rng.uniform(0.35, 1.0)
    aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
    h = int(min(_SOURCE_SIDE, round(np.sqrt(area / aspect))))
    w = int(min(_SOURCE_SIDE, round(np.sqrt(area * aspect))))
    y = int(rng.integers(0, _SOURCE_SIDE - h + 1))
    x = int(rng.integers(0, _SOURCE_SIDE - w + 1))
    ys = y + (np.arange(side) * h) // side
    xs = x + (np.arange(side) * w) // side
    if rng.random() < 0.5:
        xs = xs[::-1]
    pixels = images[i % len(images)][:, ys[:, None], xs[None, :]].astype(np.float32)
    pixels *= np.float32(rng.uniform(0.6, 1.4))  # brightness
    mean = pixels.mean()
    pixels -= mean  # contrast
    pixels *= np.float32(rng.uniform(0.6, 1.4))
    pixels += mean
    grey = pixels.mean(axis=0, keepdims=True)
    pixels -= grey  # saturation
    pixels *= np.float32(rng.uniform(0.6, 1.4))
    pixels += grey
    np.clip(pixels, 0, 255, out=pixels)
    out[...] = pixels


# ----------------------------------------------------------------- producer


@dataclass(frozen=True)
class ProducerConfig:
    """What a producer process needs; small and picklable under spawn.

    pool: how many batch buffers it rotates through: 1, unless the transport
    keeps a reference to a handed-over batch for a while (mp.Queue pickles
    in a feeder thread, DataLoader's worker too) and needs more buffers than
    batches in flight, or the producer would overwrite a batch not yet sent
    (see Case.producer).
    pace_s: minimum interval between batches (latency runs); 0: free-running.
    """

    workload: Workload
    pool: int = 1
    pace_s: float = 0.0


@dataclass
class Producer:
    """Makes batch n in one process. Per batch, for the copy workloads: write
    the stamp (16 bytes) into one of `pool` prepared buffers and hand it
    over; for the compute workload: compute every sample into it. The same
    work whatever the transport; only where the bytes land differs."""

    cfg: ProducerConfig
    seed: int = 0
    _buffers: list[Arrays] = field(default_factory=list)
    _rows: dict[int, list[Arrays]] = field(default_factory=dict)
    _images: Any = None  # a compute workload's source images
    _next_ns: int = 0  # pacing: the earliest time of the next hand-over

    @property
    def workload(self) -> Workload:
        return self.cfg.workload

    def _template(self) -> Arrays:
        """A batch of random content, made in milliseconds (it is set-up, not
        per-batch work, but it delays every transport's first batch)."""
        rng = np.random.default_rng(self.seed)
        out = []
        for _, shape, dt in self.workload.fields:
            full = (self.workload.rows, *shape)
            dtype = np.dtype(dt)
            if dtype.kind == "f":
                out.append(rng.random(full, dtype=np.float32).astype(dtype, copy=False))
            elif len(shape) == 0:  # labels
                out.append(rng.integers(0, 1000, full, dtype=dtype))
            else:  # random bytes, 64 bits at a time
                nbytes = int(np.prod(full)) * dtype.itemsize
                words = rng.integers(0, 2**64 - 1, -(-nbytes // 8), np.uint64, True)
                out.append(words.view(np.uint8)[:nbytes].view(dtype).reshape(full))
        return tuple(out)

    def _buffer(self, n: int) -> Arrays:
        k = n % max(1, self.cfg.pool)
        while len(self._buffers) <= k:  # made lazily: a probe needs only one
            if self.workload.compute:
                self._buffers.append(self.workload.empty())
            elif self._buffers:
                self._buffers.append(tuple(a.copy() for a in self._buffers[0]))
            else:
                self._buffers.append(self._template())
        return self._buffers[k]

    def _make(self, i: int, out: np.ndarray[Any, Any]) -> None:
        """Sample i's image of a compute workload, made into `out`."""
        if self._images is None:
            rng = np.random.default_rng(self.seed)
            if self.workload.compute == "decode":
                self._images = _compressed_images(rng)
            else:
                self._images = _source_images(rng)
        if self.workload.compute == "decode":
            decode(self._images, i, out)
        else:
            augment(self._images, i, out)

    def _pace(self) -> int:
        """Waits out the pace (sleeping: a busy wait would hold the GIL that
        a queue's feeder thread needs), then returns the hand-over time."""
        if self.cfg.pace_s > 0:
            left = self._next_ns - time.perf_counter_ns()
            if left > 0:
                time.sleep(left / 1e9)
            now = time.perf_counter_ns()
            # From this batch on, not from a schedule: a producer held up by
            # a full queue does not then send a burst that waits in line.
            self._next_ns = now + int(self.cfg.pace_s * 1e9)
            return now
        return time.perf_counter_ns()

    def _compute_rows(self, base: int, out: Arrays) -> None:
        for j in range(len(out[0])):
            self._make(base + j, out[0][j])
            out[1][j] = (base + j) % 1000

    def batch(self, n: int) -> Arrays:
        """Batch n in a reused buffer; valid until `pool` more batches."""
        buf = self._buffer(n)
        if self.workload.compute:
            self._compute_rows(n * self.workload.rows, buf)
        stamp(buf[0], n, self._pace())
        return buf

    def fill(self, n: int, out: Arrays) -> None:
        """Batch n written straight into `out` (a slot's arrays)."""
        if self.workload.compute:
            self._compute_rows(n * self.workload.rows, out)
        else:
            # From the same rotating buffers batch() hands over, so the
            # bytes read are the same as for every other transport.
            for dst, src in zip(out, self._buffer(n)):
                np.copyto(dst, src[: len(dst)])  # an epoch's last batch is short
        stamp(out[0], n, self._pace())

    def sample(self, i: int) -> Arrays:
        """Sample i: row i % rows of batch i // rows's buffer (row 0 stamped
        with the batch number), or a freshly computed sample."""
        rows = self.workload.rows
        if self.workload.compute:
            image = np.empty(self.workload.fields[0][1], np.uint8)
            self._make(i, image)
            return image, np.array(i % 1000, np.int64)
        n = i // rows
        k = n % max(1, self.cfg.pool)
        if k not in self._rows:
            t = self._buffer(k)
            self._rows[k] = [tuple(f[r] for f in t) for r in range(rows)]
        row = self._rows[k][i % rows]
        if i % rows == 0:
            stamp(row[0], n, self._pace())
        return row


# ------------------------------------------------------------------ sources


class BatchSource:
    """Callable source: an endless iterator of whole batches (the Keras
    GeneratorEnqueuer / get_batch pattern); fastq's callable source and the
    queue producers all iterate it."""

    def __init__(self, cfg: ProducerConfig, seed: int = 0) -> None:
        self.cfg = cfg
        self.seed = seed

    def __call__(self) -> Iterator[Arrays]:
        producer = Producer(self.cfg, self.seed)
        n = 0
        while True:
            yield producer.batch(n)
            n += 1


class ThreadBatches:
    """Batch n for a map stage run by a pool of threads or processes
    (SPDL's pipe, torchdata's ParallelMapper): each thread makes its batches
    with a producer of its own, as each process does, so that no two threads
    share one producer's buffers."""

    def __init__(self, cfg: ProducerConfig) -> None:
        self.cfg = cfg
        self._local = threading.local()

    def __getstate__(self) -> ProducerConfig:
        return self.cfg

    def __setstate__(self, cfg: ProducerConfig) -> None:
        self.cfg = cfg
        self._local = threading.local()

    def __call__(self, n: int) -> Arrays:
        producer = getattr(self._local, "producer", None)
        if producer is None:
            producer = self._local.producer = Producer(self.cfg)
        return producer.batch(n)


class SampleStream:
    """Stream source of samples (an IterableDataset): each worker's own
    endless stream, its samples numbered from worker id << 32, so that each
    worker's batches start at a row 0 that carries the stamp."""

    def __init__(self, cfg: ProducerConfig) -> None:
        self.cfg = cfg

    def __iter__(self) -> Iterator[Arrays]:
        from fastq import get_worker_info

        info = get_worker_info()
        producer = Producer(self.cfg)
        i = 0 if info is None else info.id << 32
        while True:
            yield producer.sample(i)
            i += 1


class SampleDataset:
    """Map-style source, one sample per index: loaders collate the rows."""

    def __init__(self, cfg: ProducerConfig, length: int = DATASET_LENGTH) -> None:
        self.cfg = cfg
        self.length = length
        self._producer: Producer | None = None

    def __len__(self) -> int:
        return self.length

    @property
    def producer(self) -> Producer:
        if self._producer is None:
            self._producer = Producer(self.cfg)
        return self._producer

    def __getitem__(self, i: int) -> Arrays:
        return self.producer.sample(int(i))


class FillDataset(SampleDataset):
    """Map-style source with fastq's whole-batch hook: fill_batch writes the
    batch straight into the slot (zero-copy fill)."""

    def fill_batch(self, indices: Any, out: Arrays) -> None:
        self.producer.fill(int(indices[0]) // self.cfg.workload.rows, out)


class BatchDataset(SampleDataset):
    """Map-style source whose item i is whole batch i (DataLoader with
    batch_size=None); as many batches as the samples would make."""

    def __len__(self) -> int:
        return self.length // self.cfg.workload.rows

    def __getitem__(self, i: int) -> Arrays:
        return self.producer.batch(int(i))
