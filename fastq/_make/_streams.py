"""Stream sources: what a worker iterates when the source is not map-style.

A stream source is a zero-argument callable (a generator function included)
or an iterable object (a torch ``IterableDataset`` included). Each worker
opens its own iterator and shards itself with ``get_worker_info()``, as
DataLoader's workers do with an IterableDataset. Without ``batch_size`` the
items are whole batches; with it they are samples, written straight into
the rows of a slot. A shuffle buffer mixes a sample stream inside the
worker, the way tf.data's ``shuffle(buffer_size)`` and TF's
RandomShuffleQueue do.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..errors import ConfigError

# Tells the shuffle buffer's generator apart from every other fastq draws
# from the same seed.
_SHUFFLE_STREAM = 0x5348_5546
# Uniform draws made at a time: one numpy call per block, not per sample.
_DRAW_BLOCK = 1024


def check_stream_source(source: Any) -> None:
    """Refuses what cannot give each worker an iterator of its own."""
    if callable(source):
        return
    if not hasattr(source, "__iter__"):
        raise ConfigError(
            f"source={type(source).__name__!r} object: expected a map-style "
            "dataset (with __len__ and __getitem__), a zero-argument callable "
            "returning an iterator, or an iterable object (each worker "
            "iterates its own copy)"
        )
    if isinstance(source, Iterator):
        # A generator or any other iterator: one stream, which several
        # workers could only split at random, and which a process worker
        # cannot even receive (generators do not pickle).
        raise ConfigError(
            f"source={type(source).__name__!r} is an iterator (a generator, "
            "for example), which cannot be restarted or given to each worker; "
            "pass what makes it instead: the generator function itself "
            "(source=make_batches, not make_batches()), or an iterable object "
            "whose __iter__ makes a fresh iterator"
        )


def check_thread_sharding(source: Any, workers: int) -> None:
    """Refuses a torch IterableDataset to several thread workers: it shards
    itself with ``torch.utils.data.get_worker_info()``, which has one answer
    per process and is None in threads, so every thread would yield the
    whole dataset."""
    data = sys.modules.get("torch.utils.data")
    if workers == 1 or data is None or not isinstance(source, data.IterableDataset):
        return
    raise ConfigError(
        f"worker_method='thread' with workers={workers} and a torch "
        f"IterableDataset ({type(source).__name__}): "
        "torch.utils.data.get_worker_info() is None in a thread, so each of "
        f"the {workers} threads would yield the whole dataset; use "
        "worker_method='process' (each process answers it, as under "
        "DataLoader), or workers=1"
    )


def warn_fewer_shards(source: Any, workers: int) -> None:
    """One warning, naming both counts, where a source that says how many
    shards it has (HF datasets' ``n_shards``) has fewer than the workers
    its iterators see: it cannot split a shard, so the others idle."""
    shards = getattr(source, "n_shards", None)
    if not isinstance(shards, int) or isinstance(shards, bool) or shards >= workers:
        return
    warnings.warn(
        f"{type(source).__name__} has {shards} shards for {workers} workers: "
        f"{workers - shards} of them get no shard and stay idle. Reshard it "
        f"into at least {workers} (HF datasets: to_iterable_dataset(num_shards="
        f"{workers}), or more files), pass num_workers={shards}, or read "
        "parquet files with fastq.ParquetRows, which splits row groups",
        UserWarning,
        stacklevel=4,
    )


def source_name(source: Any) -> str:
    """What a stream's state names its source by: the generator function's
    or the iterable's class's qualified name (an object's attributes, such
    as its list of files, may change between runs; its class does not)."""
    named = source if callable(source) and hasattr(source, "__qualname__") else None
    kind = named if named is not None else type(source)
    module = getattr(kind, "__module__", None) or "?"
    return f"{module}.{getattr(kind, '__qualname__', type(kind).__name__)}"


def open_stream(source: Any) -> Iterator[Any]:
    """A worker's own iterator over a stream source."""
    made = source() if callable(source) else source
    try:
        return iter(made)
    except TypeError:
        raise ConfigError(
            f"source() returned a {type(made).__name__!r}, which is not "
            "iterable: a callable source must return an iterator (a "
            "generator function is one)"
        ) from None


def shuffle_rng(
    seed: int, pass_: int, rank: int, worker_id: int
) -> np.random.Generator:
    """The shuffle buffer's generator of one worker in one pass: the same
    for the same seed, pass, rank and worker id, whatever else runs."""
    return np.random.default_rng(
        np.random.SeedSequence([seed, _SHUFFLE_STREAM, pass_, rank, worker_id])
    )


class ShuffleBuffer:
    """tf.data's ``shuffle(buffer_size)`` over one worker's samples: it
    fills with `size` samples, then each sample out is a random one of the
    buffer, whose place the stream's next sample takes; once the stream
    ends, the buffer drains in random order. It holds references to the
    samples, never copies of them (a reader that reuses one array for every
    sample must yield a copy). ``skip(n)`` passes over n samples out, the
    same ones a run that delivered them drew. ``position`` is the place in
    the worker's own stream of the sample last handed out, or of the one
    the stream failed to make: what an error names."""

    def __init__(self, it: Iterator[Any], size: int, rng: np.random.Generator) -> None:
        self._it: Iterator[Any] | None = it
        self._size = size
        self._buffer: list[Any] = []
        self._places: list[int] = []  # each buffered sample's stream place
        self._taken = 0  # samples taken from the stream
        self._rng = rng
        self._draws = np.empty(0)
        self._next_draw = 0
        self.position = -1

    def __iter__(self) -> ShuffleBuffer:
        return self

    def __next__(self) -> Any:
        buffer, places = self._buffer, self._places
        while self._it is not None and len(buffer) < self._size:
            sample = self._take()
            if self._it is not None:
                buffer.append(sample)
                places.append(self._taken - 1)
        if not buffer:
            raise StopIteration
        j = self._draw(len(buffer))
        out = buffer[j]
        self.position = places[j]
        if self._it is not None:
            sample = self._take()
            if self._it is not None:
                buffer[j], places[j] = sample, self._taken - 1
                return out
        buffer[j], places[j] = buffer[-1], places[-1]
        buffer.pop()
        places.pop()
        return out

    def _take(self) -> Any:
        """The stream's next sample; at its end, None and no stream."""
        assert self._it is not None
        try:
            sample = next(self._it)
        except StopIteration:
            self._it = None
            return None
        except BaseException:
            self.position = self._taken
            raise
        self._taken += 1
        return sample

    def _draw(self, n: int) -> int:
        """A uniform index below n."""
        k = self._next_draw
        if k == len(self._draws):
            self._draws = self._rng.random(_DRAW_BLOCK)
            k = 0
        self._next_draw = k + 1
        return int(self._draws[k] * n)

    def skip(self, n: int) -> None:
        for _ in range(n):
            try:
                next(self)
            except StopIteration:
                return


def worker_stream(
    source: Any,
    *,
    shuffle_buffer: int,
    seed: int,
    pass_: int,
    rank: int,
    worker_id: int,
) -> Iterator[Any]:
    """What a worker iterates in one pass: its own iterator over the
    source, through a shuffle buffer if it has one."""
    it = open_stream(source)
    if shuffle_buffer:
        rng = shuffle_rng(seed, pass_, rank, worker_id)
        it = ShuffleBuffer(it, shuffle_buffer, rng)
    return it


__all__ = [
    "ShuffleBuffer",
    "check_stream_source",
    "open_stream",
    "shuffle_rng",
    "source_name",
    "warn_fewer_shards",
    "worker_stream",
]
