"""A list of Python records kept once, in shared memory, for every worker to
read without copying it: NOTE [ Records in shared memory ]."""

from __future__ import annotations

import io
import pickle
import sys
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ..errors import ConfigError
from ._records import ENCODED, FIRST_KEY_SET, KEY_SETS, PICKLED, Encoder, RecordReader
from ._shared_arrays import shared_bytes

# NOTE [ Records in shared memory ]
#
# Reading a Python object writes its reference count, so a forked worker
# that reads a list of a million dicts copies every page they lie on: the
# list exists once per worker by the end of an epoch. Here each record is
# stored on its own, end to end in one memfd, and an array of offsets (in
# a second) says where each one starts and ends; a read decodes one
# record, a new object the worker owns and drops. Nothing a worker reads
# is a Python object, so nothing it reads is written, and the pages stay
# shared, whatever the start method: both buffers are shared arrays
# (fastq/_workers/_shared_arrays.py), inherited by a forked worker and
# mapped by a spawned one, with their lifetime.
#
# A record's first byte says how the rest is read (src_c/_records.pyx):
# - a plain record (None, bools, ints, floats, complex numbers, strings,
#   bytes, and lists, tuples, dicts, sets and frozensets of them, each
#   exactly of its type, at most 100 deep) in a compact encoding of its
#   own: the common values laid out as C reads them, the rarer ones (an
#   int past 64 bits, a complex, a set) marshalled in place;
# - a dict whose keys are all exactly strings, by its values alone, in
#   the same encoding, after the number of its key set: the store keeps
#   each key set once (up to 254 of them; a dict of another set, or of the
#   same keys in another order, has its own), interned, and a read builds
#   the dict from them in their order;
# - anything else, pickled (a numpy scalar, a bytearray, an int or a dict
#   subclass: what marshal or the encoding would turn into its base type),
#   so that every record reads back equal and of the types it had.
# The compiled reader takes record i's offsets from the int64 arrays and
# decodes from a pointer into the buffer, without a Python frame, a slice
# or a bytes object in between.
#
# Chosen by measurement (benchmarks/shared_records_memory.py, read section:
# 1,000,000 COCO-style dicts read in a shuffled order, in one process;
# instructions a read counted by callgrind; docs/performance.md): each
# record pickled and read with pickle.loads on a memoryview slice cost 4.0
# times a list's read (1,539 ns to 385); the compiled reader over marshal
# 1.8 times, over marshal without its back-references 1.6 to 2.2 (6,040
# instructions a read, loop included); the encoding here 1.5 to 1.6 times
# (625 ns to 426; 4,796 instructions, the list's read 1,117), and 0.7
# times with every field read (the interned keys make a lookup by a
# literal a pointer comparison). Half of what is left is building the
# dict: copying a dict of the keys and replacing its values measured no
# cheaper. A forked worker's reads write the reference counts of the
# key strings (a few pages, the same in every worker, interned ones
# immortal from 3.12); nothing else they read is an object. An Arrow
# table read a row at a time is 10 to 70 times slower, and holds flat
# records only; gc.freeze() before the fork leaves the reference counts
# written, and no CPython (3.12's immortal objects included) makes a dict
# immortal on request.

_PROTOCOL = pickle.HIGHEST_PROTOCOL
_TAGS = [bytes((tag,)) for tag in range(256)]


class SharedRecords(RecordReader, Sequence[Any]):
    """Records in shared memory, read back one at a time: made by
    ``fastq.shared_records``, whose docstring is the user's. Reading,
    ``len`` and slicing are the compiled RecordReader's."""

    __slots__ = ()

    def __reduce__(self) -> tuple[Any, ...]:
        # The arrays travel as shared arrays do: a spawned worker of fastq's
        # maps them; plain pickle copies them.
        return (_rebuilt, (self._data, self._starts, self._ends, self._key_sets))

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


def _rebuilt(
    data: Any, starts: Any, ends: Any, key_sets: tuple[tuple[str, ...], ...]
) -> SharedRecords:
    # Unpickled keys are new strings: interned again, a dict built here
    # holds the same key objects as the worker's own code (whose literals
    # are interned), and a lookup by one of them is a pointer comparison.
    key_sets = tuple(tuple(sys.intern(key) for key in keys) for keys in key_sets)
    return SharedRecords(data, starts, ends, key_sets)


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
    writer = _RecordWriter()
    offsets = [0]
    for i, record in enumerate(records):
        writer.store(i, record)
        offsets.append(writer.size)
    data = shared_bytes(writer.buffer(), "fastq-shared-records")
    bounds = shared_bytes(
        np.asarray(offsets, dtype=np.int64).view(np.uint8), "fastq-record-offsets"
    ).view(np.int64)
    return SharedRecords(data, bounds[:-1], bounds[1:], tuple(writer.key_sets))


def _mapped_bytes(arr: np.ndarray[Any, Any]) -> int:
    base: Any = arr
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return len(base) if not isinstance(base, np.ndarray) else int(base.nbytes)


class _RecordWriter:
    """Writes records end to end in one buffer, each after the tag that
    says how to read it (NOTE [ Records in shared memory ])."""

    def __init__(self) -> None:
        self._file = io.BytesIO()
        self._pickler = _RecordPickler(self._file)
        self._encoder = Encoder()
        self.key_sets: list[tuple[str, ...]] = []
        self._key_set_of: dict[tuple[str, ...], int] = {}
        self.size = 0

    def store(self, index: int, record: Any) -> None:
        write = self._file.write
        values = self._encoder.values(record) if type(record) is dict else None
        tag = None if values is None else self._key_set_tag(record)
        if tag is not None:
            write(_TAGS[tag])
            write(values)
        elif (plain := self._encoder.plain(record)) is not None:
            write(_TAGS[ENCODED])
            write(plain)
        else:
            write(_TAGS[PICKLED])
            self._pickler.store(index, record)
        self.size = self._file.tell()

    def _key_set_tag(self, record: dict[str, Any]) -> int | None:
        keys = tuple(record)  # exactly str: equal keys are the same keys
        number = self._key_set_of.get(keys)
        if number is None:
            if len(self.key_sets) == KEY_SETS:
                return None  # a store of many shapes: the rest go whole
            number = len(self.key_sets)
            self.key_sets.append(tuple(sys.intern(key) for key in keys))
            self._key_set_of[keys] = number
        return FIRST_KEY_SET + number

    def buffer(self) -> np.ndarray[Any, Any]:
        return np.frombuffer(self._file.getbuffer(), dtype=np.uint8)


class _RecordPickler(pickle.Pickler):
    """Pickles records each loadable on its own, and names what a record
    that cannot be pickled holds."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, _PROTOCOL)
        # The last object pickle could not handle as a builtin: the one at
        # fault when pickling fails. reducer_override is never called for
        # builtin values and containers, so this costs plain records nothing.
        self._last: Any = None

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
