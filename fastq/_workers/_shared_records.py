"""A list of Python records kept once, in shared memory, for every worker to
read without copying it: NOTE [ Records in shared memory ]."""

from __future__ import annotations

import io
import operator
import pickle
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

import numpy as np

from ..errors import ConfigError
from ._shared_arrays import shared_bytes

# NOTE [ Records in shared memory ]
#
# Reading a Python object writes its reference count, so a forked worker
# that reads a list of a million dicts copies every page they lie on: the
# list exists once per worker by the end of an epoch. Here each record is
# pickled on its own, the pickles lie end to end in one memfd, and an array
# of offsets (in a second) says where each one starts and ends; a read
# unpickles one record, a new object the worker owns and drops. Nothing a
# worker reads is a Python object, so nothing it reads is written, and the
# pages stay shared, whatever the start method: both buffers are shared
# arrays (fastq/_workers/_shared_arrays.py), inherited by a forked worker
# and mapped by a spawned one, with their lifetime.
#
# Chosen by measurement (benchmarks/shared_records_memory.py and
# benchmarks/records_fork_model.py; docs/performance.md): unpickling a
# record is the whole cost of a read (the offsets and the slice add about
# 0.1 us); marshal reads 15 to 25% faster but turns a numpy scalar or a
# bytearray into bytes without a word; an Arrow table read a row at a time
# is 10 to 70 times slower, and holds flat records only; gc.freeze() before
# the fork leaves the reference counts written, and no CPython (3.12's
# immortal objects included) makes a dict immortal on request.

_PROTOCOL = pickle.HIGHEST_PROTOCOL


class SharedRecords(Sequence[Any]):
    """Records in shared memory, read back one at a time: made by
    ``fastq.shared_records``, whose docstring is the user's."""

    __slots__ = ("_bytes", "_data", "_end_at", "_ends", "_start_at", "_starts")

    def __init__(self, data: Any, starts: Any, ends: Any) -> None:
        # The arrays keep the shared memory alive; the memoryviews are the
        # read path (indexing one gives a Python int, a numpy array a
        # numpy scalar, about twice as slow).
        self._data = data
        self._starts = starts
        self._ends = ends
        self._bytes = memoryview(data)
        self._start_at = memoryview(starts)
        self._end_at = memoryview(ends)

    def __len__(self) -> int:
        return len(self._start_at)

    @overload
    def __getitem__(self, index: int) -> Any: ...

    @overload
    def __getitem__(self, index: slice) -> SharedRecords: ...

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return SharedRecords(self._data, self._starts[index], self._ends[index])
        try:
            start, end = self._start_at[index], self._end_at[index]
        except IndexError:
            raise IndexError(
                f"record index {index} out of range for {len(self)} records"
            ) from None
        except TypeError:
            return self[operator.index(index)]  # or its TypeError
        return pickle.loads(self._bytes[start:end])

    def __iter__(self) -> Iterator[Any]:
        data, loads = self._bytes, pickle.loads
        for start, end in zip(self._start_at, self._end_at):
            yield loads(data[start:end])

    def __reduce__(self) -> tuple[Any, ...]:
        # The arrays travel as shared arrays do: a spawned worker of fastq's
        # maps them; plain pickle copies them.
        return (SharedRecords, (self._data, self._starts, self._ends))

    @property
    def nbytes(self) -> int:
        """Bytes of shared memory the records and their offsets lie in
        (a slice's are its whole store's)."""
        return _mapped_bytes(self._data) + _mapped_bytes(self._starts)

    def __repr__(self) -> str:
        return (
            f"<fastq.shared_records: {len(self)} records, "
            f"{self.nbytes / (1 << 20):.1f} MiB shared>"
        )


def shared_records(records: Iterable[Any]) -> SharedRecords:
    """Records (dicts, tuples, lists of plain values) in shared memory, for
    a dataset to hold instead of a list.

    A forked worker that reads a Python list writes the reference count of
    every object it reads, and so copies every page it reads: over an epoch,
    each worker ends up with its own copy of the list. The records kept
    here are read without writing anything shared, so they exist once for
    the training process and all its workers, under every start method.

    Parameters
    ----------
    records : iterable
        The records, in order: any picklable values (numbers, strings,
        bytes, None, and lists, tuples, dicts and sets of them; numpy
        scalars and arrays too). An iterator is read once, so a manifest
        can be streamed in without building the list first.

    Returns
    -------
    SharedRecords
        A read-only sequence: ``len``, indexing (negative too), iteration;
        ``records[i]`` is a new copy of record i, equal to it and of the
        same types (changing it changes nothing stored). A slice is a
        view of the same shared memory, without a copy. The memory is freed
        when the last view here is garbage and the workers that mapped it
        have exited.

    Raises
    ------
    ConfigError
        If a record cannot be pickled (an open file, a lock, a lambda):
        the message names its index and the type of the value at fault.
    fastq.SharedMemoryError
        If the memory for them is not available.

    Examples
    --------
    >>> class Annotations:
    ...     def __init__(self, path):
    ...         with open(path) as f:
    ...             self.records = fastq.shared_records(json.load(f))
    """
    pickler = _RecordPickler()
    offsets = [0]
    for i, record in enumerate(records):
        pickler.store(i, record)
        offsets.append(pickler.size)
    data = shared_bytes(pickler.buffer(), "fastq-shared-records")
    bounds = shared_bytes(
        np.asarray(offsets, dtype=np.int64).view(np.uint8), "fastq-record-offsets"
    ).view(np.int64)
    return SharedRecords(data, bounds[:-1], bounds[1:])


def _mapped_bytes(arr: np.ndarray[Any, Any]) -> int:
    base: Any = arr
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return len(base) if not isinstance(base, np.ndarray) else int(base.nbytes)


class _RecordPickler(pickle.Pickler):
    """Pickles records end to end in one buffer, each loadable on its own,
    and names what a record that cannot be pickled holds."""

    def __init__(self) -> None:
        self._file = io.BytesIO()
        super().__init__(self._file, _PROTOCOL)
        # The last object pickle could not handle as a builtin: the one at
        # fault when pickling fails. reducer_override is never called for
        # builtin values and containers, so this costs plain records nothing.
        self._last: Any = None
        self.size = 0

    def reducer_override(self, obj: Any) -> Any:
        self._last = obj
        return NotImplemented

    def store(self, index: int, record: Any) -> None:
        self._last = record
        try:
            self.dump(record)
        except (pickle.PicklingError, TypeError, AttributeError, ValueError) as exc:
            raise ConfigError(_cannot_store(index, record, self._last, exc)) from exc
        except RecursionError as exc:
            raise ConfigError(_cannot_store(index, record, None, exc)) from exc
        self.clear_memo()  # each record loads on its own
        self.size = self._file.tell()

    def buffer(self) -> np.ndarray[Any, Any]:
        return np.frombuffer(self._file.getbuffer(), dtype=np.uint8)


def _cannot_store(index: int, record: Any, culprit: Any, exc: BaseException) -> str:
    what = f"record {index} is a {_type_name(record)}"
    if culprit is not None and culprit is not record:
        what = f"record {index} (a {_type_name(record)}) holds a {_type_name(culprit)}"
    return (
        f"shared_records(records): {what}, which cannot be stored "
        f"({type(exc).__name__}: {exc}). Records are stored pickled: numbers, "
        "strings, bytes, None, lists, tuples, dicts and other picklable "
        "values. Fix: keep what opens or runs something (an open file, a "
        "lock, a function) out of the records, as a path or a name the "
        "dataset turns into the object in its worker"
    )


def _type_name(obj: Any) -> str:
    cls = type(obj)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


__all__ = ["SharedRecords", "shared_records"]
