"""default_collate's batches written row by row as the samples are fetched,
for fastq.torch.DataLoader's workers: NOTE [ Rows written as fetched ]."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable

import numpy as np
import torch

from .._layout._packing import Arena, Codec, record_of
from .._layout._rows import RowWriter
from .._layout._spec import BatchSpec
from ..errors import SpecError

# NOTE [ Rows written as fetched ]
#
# torch's default_collate runs once a batch's samples are all fetched: it
# walks them in Python, wraps numpy scalars (torch.as_tensor of a list, 30
# us for 128 labels) and stacks each field, reading every sample again
# from memory, where the Prefetcher's per-sample path copied each one into
# its rows the moment it was made, still in the caches (src_c/_rows.pyx).
# Where collate_fn is torch's default_collate and a sample holds only numpy
# arrays, numpy scalars, Python ints and floats, in tuples, lists and dicts,
# the drop-in's worker does the same: RowWriter.write_exact copies each
# sample's leaves into the slot as it is fetched, and the batch is the
# tensors over those rows in default_collate's containers (a tuple or list
# of fields becomes a list; a dict keeps its key order).
#
# Equal to default_collate by construction, and checked: the worker's first
# batch made into a slot is collated by default_collate and also written
# this way (into scratch memory); unless both give the same batch (types,
# keys, dtypes, shapes and bytes), the worker keeps default_collate. A later
# sample that does not fit as it is (another type, shape or dtype, an int
# past int64, a first sample whose containers differ) hands the batch back
# to default_collate with the samples fetched so far: no sample is fetched
# twice, and torch's result, or its error, follows. So does a batch whose
# samples' arrays of one field lie at one address: a dataset that hands
# out one buffer it refills gets from default_collate its last contents in
# every row, and so it does here (a sampler that draws a sample twice
# costs that batch the row path, not its contents).

_SCALARS = frozenset("biufc")


class RowCollate:
    """Writes batches of one sample layout into a slot's rows and makes
    them default_collate's tensors over those rows."""

    def __init__(
        self,
        spec: BatchSpec,
        leaf_types: tuple[type, ...],
        containers: Any,
        codec: Codec,
    ) -> None:
        self.leaf_types = leaf_types
        self.codec = codec
        self.containers = containers
        self._spec = spec
        self._writer = RowWriter(spec)
        # The record of the last layout's batches (_know_record).
        self._records: dict[tuple[Any, int, int], bytes] = {}

    @classmethod
    def learn(
        cls, samples: Sequence[Any], collated: Any, codec: Codec
    ) -> RowCollate | None:
        """A RowCollate for batches of samples laid out as `samples`, whose
        default_collate is `collated`, packed with `codec`, or None where
        it would not make the same batch."""
        # A batch of samples, as a list or tuple; __getitems__ may return
        # anything default_collate takes, an array of rows among them.
        if type(samples) not in (list, tuple) or not samples:
            return None
        first = samples[0]
        try:
            containers = _containers(first)
            spec = BatchSpec.from_sample(first, len(samples))
        except (SpecError, TypeError, ValueError):
            return None
        if spec.jagged:
            return None
        leaf_types = tuple(type(x) for x in spec.flatten(first, "a sample"))
        if not all(map(_plain_leaf, leaf_types)):
            return None
        rows = cls(spec, leaf_types, containers, codec)
        scratch = np.empty(spec.slot_bytes, np.uint8)
        views = spec.views(scratch, spec.rows)
        keys = list(range(len(samples)))
        kept: list[Any] = []
        try:
            done = rows._writer.write_exact(
                samples.__getitem__, keys, views, kept, leaf_types
            )
            if done not in (len(samples), -1):  # -1: every row, a buffer reused
                return None
            batch = rows._batch(spec, views, len(samples))
        except (TypeError, ValueError, RuntimeError):  # a dtype torch lacks
            return None
        return rows if _same_batch(batch, collated) else None

    def make(
        self, get: Callable[[Any], Any], keys: list[Any], arena: Arena
    ) -> tuple[Any, list[Any]]:
        """(batch, samples fetched): the batch of get(key) for each key,
        written into the arena's slot; the batch is None where the samples
        (all, or those fetched up to the one that did not fit) are left to
        default_collate. `row` names the sample being fetched."""
        n = len(keys)
        spec = self._spec if n <= self._spec.rows else self._grow(n)
        kept: list[Any] = []
        start = arena.used
        off = arena.try_alloc(spec.slot_bytes)
        if off < 0:
            return None, kept
        views = spec.views(arena.slot[off : off + spec.slot_bytes], spec.rows)
        done = self._writer.write_exact(get, keys, views, kept, self.leaf_types)
        if done == n and _containers_of(kept[0]) == self.containers:
            batch = self._batch(spec, views, n)
            self._know_record(batch, spec, n, off, arena)
            return batch, kept
        arena.used = start  # default_collate stacks the batch afresh
        return None, kept

    def _know_record(
        self, batch: Any, spec: BatchSpec, n: int, off: int, arena: Arena
    ) -> None:
        """Hands pack() the batch's record: the same bytes for every batch
        of n rows laid at `off` by one spec, so pickled once."""
        key = (spec, n, off)
        record = self._records.get(key)
        if record is None:
            record = bytes(record_of(batch, self.codec, arena))
            self._records = {key: record}  # the last layout only
        else:
            arena.claim(off, spec.slot_bytes)
        arena.known = (batch, record)

    @property
    def row(self) -> int:
        return int(self._writer.row)

    def _grow(self, rows: int) -> BatchSpec:
        """A spec for batches of `rows` samples (more than the first had)."""
        fields = [(f.name, f.shape, f.dtype) for f in self._spec.fields]
        self._spec = BatchSpec(self._spec.structure, fields, rows)
        self._writer = RowWriter(self._spec)
        return self._spec

    def _batch(self, spec: BatchSpec, views: list[Any], n: int) -> Any:
        leaves = [torch.from_numpy(v if n == spec.rows else v[:n]) for v in views]
        return _as_collated(self.containers, spec.unflatten(leaves))

    def __reduce__(self) -> Any:
        # A copy of the source (a spawned worker's) learns afresh.
        raise TypeError("a RowCollate stays in the worker that learned it")


def _plain_leaf(t: type) -> bool:
    if t is np.ndarray or t is int or t is float:
        return True
    return issubclass(t, np.generic) and np.dtype(t).kind in _SCALARS


def _containers(sample: Any) -> Any:
    """The exact container types of a sample, as a comparable value; a
    TypeError for one default_collate would make other than a list or a
    dict (a namedtuple, an OrderedDict, a user's mapping)."""
    out = _containers_of(sample)
    if out is _OTHER:
        raise TypeError(f"{type(sample).__name__} samples keep default_collate")
    return out


_OTHER = object()


def _containers_of(obj: Any) -> Any:
    t = type(obj)
    if t is tuple or t is list:
        inner = tuple(_containers_of(v) for v in obj)
        return _OTHER if _OTHER in inner else (t, inner)
    if t is dict:
        inner = tuple(_containers_of(v) for v in obj.values())
        return _OTHER if _OTHER in inner else (dict, tuple(obj), inner)
    if isinstance(obj, (tuple, list, dict)) or hasattr(obj, "keys"):
        return _OTHER
    return None


def _as_collated(containers: Any, value: Any) -> Any:
    """The spec's unflattened batch (tuples, dicts) in default_collate's
    containers: a list for every tuple or list, a dict in key order."""
    if containers is None:
        return value
    if containers[0] is dict:
        return {
            k: _as_collated(c, value[k]) for k, c in zip(containers[1], containers[2])
        }
    return [_as_collated(c, v) for c, v in zip(containers[1], value)]


def _same_batch(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return (
            a.dtype == b.dtype
            and a.shape == b.shape
            and a.numpy().tobytes() == b.numpy().tobytes()
        )
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same_batch, a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same_batch(a[k], b[k]) for k in a)
    return False
