"""Large numpy arrays reach spawn and forkserver workers as pages of shared
memory, not as pickled bytes.

A dataset that holds a 1 GiB array (a label table, a tokenised corpus, an
index of file offsets) would otherwise be pickled into every worker: W
copies, and a start-up that grows with the array's size times W. When the
user's objects are pickled for a pool's workers (``Handoff``), every plain
ndarray of ``SHARE_AT_BYTES`` or more is written once into one memfd, and
the pickle carries only its place there; each worker maps that memfd
copy-on-write, as a forked worker sees its parent's memory: pages are
shared until a worker writes to one.

``shared_array`` puts an array in shared memory from the start (for a source
that builds its data itself, or to keep a single copy in the training
process too): its pages are never copied, and every worker maps the same
memory.
"""

from __future__ import annotations

import io
import mmap
import os
import pickle
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np

from .._core._memfd import SharedFd, available_memory, not_enough_memory, sized_memfd
from ..errors import ConfigError, SharedMemoryError

# Arrays at least this large travel as shared pages; smaller ones are cheaper
# to pickle than to map.
SHARE_AT_BYTES = 1 << 20
_ALIGN = 64  # each array of a pool's memfd starts on a cache line


# ------------------------------------------------------------ shared_array


class _Segment:
    """A memfd made by shared_array, and where it is mapped here. It holds
    no reference to the mapping, whose death closes the memfd."""

    def __init__(self, fd: int, address: int) -> None:
        self.fd = fd
        self.address = address


# id(mapping) -> its segment, while the mapping lives.
_segments: dict[int, _Segment] = {}


def shared_array(data: Any, dtype: Any = None) -> np.ndarray[Any, Any]:
    """A copy of ``data`` in shared memory, for a dataset to hold.

    Workers started by spawn or forkserver (fastq's default) map this
    memory instead of receiving a copy of the array, and a forked worker
    inherits it, so the data exists once however many workers read it.
    Writes made here are seen by the workers; a worker's own writes stay
    its own (copy-on-write), as under fork.

    Parameters
    ----------
    data : array-like
        Anything ``numpy.asarray`` takes: an array, a list of numbers, or a
        list of file paths (stored as fixed-width strings).
    dtype : numpy dtype, optional
        As for ``numpy.asarray``.

    Returns
    -------
    numpy.ndarray
        A plain ndarray over the shared memory, laid out as ``data`` (C
        order unless it is Fortran-ordered); its slices and views are
        shared too. The memory is freed when the last array that
        uses it is garbage here and the workers that mapped it have exited.
    """
    arr = np.asarray(data, dtype=dtype)
    if arr.dtype.hasobject:
        raise ConfigError(
            f"shared_array(data): data has dtype {arr.dtype}, which holds "
            "Python objects and cannot live in shared memory; pass numbers, "
            "or strings of one kind (a list of str or bytes); for records "
            "(dicts, tuples), use fastq.shared_records(data)"
        )
    return shared_bytes(arr, "fastq-shared-array")


def shared_bytes(arr: np.ndarray[Any, Any], name: str) -> np.ndarray[Any, Any]:
    """shared_array of an array, in a memfd named ``name`` (what
    /proc/PID/maps shows of it)."""
    size = max(arr.nbytes, 1)
    fd = _filled_memfd(name, size, [(arr, 0)])
    try:
        mapping = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
    except BaseException:
        os.close(fd)
        raise
    key = id(mapping)
    _segments[key] = _Segment(fd, _address_of(mapping))
    weakref.finalize(mapping, _forget_segment, key, fd, os.getpid())
    return np.ndarray(
        arr.shape, arr.dtype, buffer=mapping, strides=_contiguous_strides(arr)
    )


def _forget_segment(key: int, fd: int, pid: int) -> None:
    _segments.pop(key, None)
    if os.getpid() == pid:  # a forked child's copy is the parent's to close
        os.close(fd)


def _address_of(mapping: mmap.mmap) -> int:
    return int(np.frombuffer(mapping, dtype=np.uint8, count=1).ctypes.data)


def _segment_of(arr: np.ndarray[Any, Any]) -> _Segment | None:
    base: Any = arr
    while isinstance(base, np.ndarray):
        base = base.base
    if not isinstance(base, mmap.mmap):
        return None
    return _segments.get(id(base))


# ------------------------------------------------------------ the handoff


class Handoff:
    """The user's objects pickled once for every worker of a pool, with
    their large arrays in shared memory. ``payload()`` is made the first
    time a worker is started by spawn or forkserver (never under fork):
    the pickle (in a memfd, see NOTE [ The pickle beside the pipe ]), the
    memfds its arrays lie in, and the descriptors its objects hold (each
    worker is passed duplicates of its own). ``close()`` releases this
    process's hold on the pickle and the copied arrays (each worker keeps
    what it read or mapped).

    ``beside=False`` keeps the pickle in the payload itself, for a payload
    made with no owner left to close a memfd."""

    def __init__(self, objs: Any, dump: Any, beside: bool = True) -> None:
        self._objs = objs
        self._dump = dump  # (objs, file, arrays) -> the descriptors it names
        self.spills = beside
        self._payload: Payload | None = None
        self._copied = -1  # the memfd of copied arrays
        self._beside: list[int] = []  # memfds of pickles (the user's, configs)

    def payload(self) -> Payload:
        if self._payload is None:
            self._payload = self._make()
        return self._payload

    def _make(self) -> Payload:
        found = _Arrays()
        buf = io.BytesIO()
        # The pickler's reducer_override hands every object to found.reduce.
        descriptors = self._dump(self._objs, buf, found)
        fds = [SharedFd(s.fd) for s in found.segments]
        if found.copied:
            self._copied = _filled_memfd(
                "fastq-dataset-arrays", found.copy_bytes, found.copied
            )
            fds.append(SharedFd(self._copied))
        data: bytes | SharedFd = buf.getvalue()
        if self.spills:
            data = self.beside(buf.getbuffer(), "fastq-dataset-pickle")
        return data, fds, [SharedFd(fd) for fd in descriptors]

    def beside(self, data: Any, name: str) -> SharedFd:
        """A pickle (bytes-like) in a memfd that lives until close(), for a
        worker to read with ``read_beside``."""
        view = np.frombuffer(data, np.uint8)
        fd = _filled_memfd(name, max(len(view), 1), [(view, 0)])
        self._beside.append(fd)
        return SharedFd(fd)

    def close(self) -> None:
        self._objs = None
        for fd in (self._copied, *self._beside):
            if fd >= 0:
                os.close(fd)
        self._copied, self._beside = -1, []


# NOTE [ The pickle beside the pipe ]
#
# spawn and forkserver send a new worker its Process object through a pipe,
# and the parent blocks in that write (popen_spawn_posix._launch) until the
# child has read all but a pipe's capacity (64 KiB, or a page or two where
# the user holds many pipes). The child reads it only after re-running the
# main script; a script without a main guard that builds a loader there
# makes the child exit first, and multiprocessing keeps its own copy of the
# pipe's read end open in the parent while it writes, so the write never
# fails: the parent hangs. The user's pickle is what makes that write grow
# (a dataset holding a list of a million paths is megabytes), and the
# worker's configuration with it (its first batch's indices), so both lie
# in memfds the worker reads instead (WorkerConfig.__getstate__), and what
# goes through the pipe is about a kilobyte, whatever the dataset or the
# batch size: the child's early exit is then a WorkerDied.


def read_beside(shared: SharedFd) -> Any:
    """What Handoff.beside put in a memfd (this worker's descriptor of it,
    which is closed)."""
    try:
        size = os.fstat(shared.fd).st_size
        with mmap.mmap(shared.fd, size, prot=mmap.PROT_READ) as pickled:
            return pickle.loads(pickled)
    finally:
        os.close(shared.fd)


# A pickle (or the memfd it lies in), the memfds of its arrays, the
# descriptors its objects hold.
Payload = tuple["bytes | SharedFd", list[SharedFd], list[SharedFd]]


class PayloadFd:
    """A descriptor an object in the payload holds (what
    multiprocessing.reduction.DupFd returns while it is pickled): its index
    among the payload's descriptors. ``detach()`` in the worker gives a
    duplicate of the worker's own, as DupFd's does."""

    def __init__(self, index: int) -> None:
        self.index = index

    def detach(self) -> int:
        return os.dup(_incoming_fds[self.index])


class _Arrays:
    """While pickling: each large array, and each shared_array, becomes a
    reference to its place in a memfd the worker maps: index i names the
    memfd of segments[i] (a shared_array's), _COPIES the memfd the copies
    are written to once the pickle is done. The pickler's memo sees an
    array referenced twice only once, so it is copied once."""

    def __init__(self) -> None:
        self.segments: list[_Segment] = []
        self.copied: list[tuple[np.ndarray[Any, Any], int]] = []  # (array, offset)
        self.copy_bytes = 0

    def reduce(self, obj: Any) -> Any:
        if type(obj) is not np.ndarray or obj.dtype.hasobject:
            return NotImplemented
        segment = _segment_of(obj)
        if segment is not None:
            if segment not in self.segments:
                self.segments.append(segment)
            offset = obj.ctypes.data - segment.address
            where: Any = self.segments.index(segment)
            strides = obj.strides
        elif obj.nbytes >= SHARE_AT_BYTES:
            offset = self.copy_bytes
            self.copied.append((obj, offset))
            self.copy_bytes += -(-obj.nbytes // _ALIGN) * _ALIGN
            where = _COPIES
            strides = _contiguous_strides(obj)
        else:
            return NotImplemented
        return _attach, (where, offset, obj.shape, obj.dtype, strides)


# The copies' memfd, whatever its index in the payload turns out to be.
_COPIES = "copies"


def _filled_memfd(
    name: str, size: int, arrays: list[tuple[np.ndarray[Any, Any], int]]
) -> int:
    """A memfd of ``size`` bytes holding each array at its offset, laid out
    as _contiguous_strides says. Written with pwrite, not through a mapping:
    the kernel allocates each page as it fills it (no fault per page), and
    a shortage is an error here, never a SIGBUS in a reader later."""
    fd = sized_memfd(name, size)
    try:
        for arr, offset in arrays:
            for block in _blocks(arr):
                data = block.view(np.uint8).data
                while data:
                    n = os.pwrite(fd, data[:_WRITE_CHUNK], offset)
                    data, offset = data[n:], offset + n
    except OSError as exc:
        os.close(fd)
        raise SharedMemoryError(
            not_enough_memory(size, available_memory(), exc, what=name)
        ) from exc
    except BaseException:
        os.close(fd)
        raise
    return fd


_WRITE_CHUNK = 64 << 20


def _blocks(arr: np.ndarray[Any, Any]) -> Iterator[np.ndarray[Any, Any]]:
    """The array's bytes in its memory order (contiguous) or in C order (a
    copy, a bounded block of leading rows at a time), as 1-d arrays."""
    if arr.flags.c_contiguous or arr.flags.f_contiguous:
        yield arr.ravel(order="K")
        return
    rows = max(1, _WRITE_CHUNK // max(1, arr[:1].nbytes))
    for i in range(0, len(arr), rows):
        yield np.ascontiguousarray(arr[i : i + rows]).ravel()


def _contiguous_strides(arr: np.ndarray[Any, Any]) -> tuple[int, ...]:
    """The array's own strides if it is contiguous (C or Fortran order),
    else C order's: copies keep a Fortran array's layout."""
    if arr.flags.c_contiguous or arr.flags.f_contiguous:
        return tuple(arr.strides)
    strides, step = [], arr.itemsize
    for dim in reversed(arr.shape):
        strides.append(step)
        step *= dim
    return tuple(reversed(strides))


# ------------------------------------------------------------ worker side

# While a worker unpickles the user's objects: the memfds of the payload,
# mapped copy-on-write, and the descriptors its objects hold.
_incoming: list[mmap.mmap] = []
_incoming_fds: list[int] = []


def load_for_worker(
    data: bytes | SharedFd, fds: list[SharedFd], descriptors: list[SharedFd]
) -> Any:
    """The user's objects, in a worker: maps the payload's memfds, then
    unpickles (each array a view of its mapping, each object's descriptor
    a duplicate of the one passed for it)."""
    global _incoming, _incoming_fds
    mappings = []
    try:
        for shared in fds:
            size = os.fstat(shared.fd).st_size
            mappings.append(
                mmap.mmap(
                    shared.fd,
                    size,
                    flags=mmap.MAP_PRIVATE,
                    prot=mmap.PROT_READ | mmap.PROT_WRITE,
                )
            )
        _incoming, _incoming_fds = mappings, [d.fd for d in descriptors]
        if isinstance(data, SharedFd):
            return read_beside(data)
        return pickle.loads(data)
    finally:
        _incoming, _incoming_fds = [], []
        for shared in (*fds, *descriptors):
            os.close(shared.fd)  # the mappings and the objects' duplicates stay


def _attach(
    where: int | str,
    offset: int,
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
    strides: tuple[int, ...],
) -> np.ndarray[Any, Any]:
    mapping = _incoming[-1] if where == _COPIES else _incoming[int(where)]
    return np.ndarray(shape, dtype, buffer=mapping, offset=offset, strides=strides)


__all__ = [
    "SHARE_AT_BYTES",
    "Handoff",
    "Payload",
    "PayloadFd",
    "load_for_worker",
    "shared_array",
    "shared_bytes",
]
