"""A dataset's ``samples`` as its workers read them: the list, kept for the
user, and a copy of it in shared memory, made when workers start, that the
workers read instead: NOTE [ Samples the workers do not copy ]."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from multiprocessing import context
from typing import Any

from .._make._worker_info import get_worker_info
from ..errors import ConfigError, SharedMemoryError

# NOTE [ Samples the workers do not copy ]
#
# ``samples`` stays a list, torchvision's: users read it, slice it, add to
# it, replace it and change it in place before iterating. A forked worker
# that read it would write the reference counts of every tuple and string
# it touched, and so copy the list over an epoch (a spawned one would get
# its own copy at start). So when fastq starts worker processes, it first
# calls ``_fastq_before_workers(share)`` on the datasets it finds in the
# source (fastq/_workers/_before_workers.py): the dataset puts its list
# into records in shared memory there (``share`` is
# ``fastq.shared_records``: fastq.vision sits below the workers' layer,
# which hands it down), and says which of its attributes workers then never
# read, which the copied-data warning leaves out.
#
# The store is made from the list as it is at that moment, so edits made
# before iterating are what workers see. It is kept for the next start
# (each epoch's, without persistent workers) while the list is equal to a
# shallow copy taken with it: that compares item by item, by identity
# first, so an unchanged list costs a pass over two arrays of pointers (a
# few ms for a million), and any replacement, insertion, deletion, sort or
# new list of other items makes a new store. (An item that is itself a
# list changed in place is not seen; torchvision's items are tuples.)
#
# Only a fastq worker process reads the store (``get_worker_info()`` set,
# and a process other than the one that made it): the training process
# and thread workers read the list, which is the truth there; so does any
# other loader's worker (torch's own), which would find the store of an
# earlier start. Pickled for a worker process (multiprocessing's spawning
# Popen set, as for a spawn or forkserver worker), the dataset travels
# without the lists the store holds: a worker that reads ``samples``,
# ``imgs`` or ``targets`` rebuilds it from the store then (``__getattr__``).
# Pickled anywhere else, it travels without the store (a cache of this
# process), which a later start makes again.

_READ_FROM_RECORDS = ("samples", "imgs", "targets")
# What workers never read once the store exists, where the dataset's own
# __getitem__ reads it.
_UNREAD_IN_WORKERS = (*_READ_FROM_RECORDS, "_records_of")
_STORE = ("_records", "_records_of", "_records_pid")

# This process's id, kept as forks change it: a read asks it per sample,
# and os.getpid() is a system call each time.
_pid = os.getpid()


def _forked() -> None:
    global _pid
    _pid = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


class SharedSamples:
    """``samples`` read by fastq's workers from records in shared memory,
    made when they start (NOTE [ Samples the workers do not copy ]).

    A base of ImageFiles: it keeps ``samples``, ``imgs`` and ``targets``
    as torchvision's lists, and adds ``_fastq_before_workers``."""

    samples: list[tuple[str, int]]
    imgs: list[tuple[str, int]]
    targets: list[int]
    # The store, the list it was made from (a shallow copy), and the
    # process that made it.
    _records: Sequence[tuple[str, int]] | None = None
    _records_of: list[tuple[str, int]] | None = None
    _records_pid = 0

    def _reads_records(self) -> bool:
        """Whether this class's __getitem__ reads its sample through
        ``_sample`` (a subclass that overrides it may read ``samples``)."""
        raise NotImplementedError

    def _fastq_before_workers(
        self, share: Callable[[Iterable[Any]], Sequence[Any]]
    ) -> tuple[str, ...]:
        """Called by fastq in the training process as its worker processes
        are about to start: makes the store from ``samples`` unless the one
        made before is of an equal list. Returns the attributes workers
        then do not read."""
        if not self._reads_records():
            return ()
        if not self._records_fresh():
            self._records = self._records_of = None  # the old store freed first
            try:
                records = share(self.samples)
            except (SharedMemoryError, ConfigError):
                # No memory for it, or an item that cannot be stored: the
                # workers read the list, as without the store.
                return ()
            self._records_of = list(self.samples)
            self._records, self._records_pid = records, os.getpid()
        return _UNREAD_IN_WORKERS

    def _records_fresh(self) -> bool:
        if self._records is None or self._records_pid != os.getpid():
            return False
        try:
            return bool(self.samples == self._records_of)
        except Exception:  # an item whose == fails: made again
            return False

    def _sample(self, index: int) -> tuple[str, int]:
        """Sample ``index``'s (path, label): from the store in a fastq
        worker process, from the list elsewhere."""
        records = self._records
        if (
            records is not None
            and self._records_pid != _pid
            and get_worker_info() is not None
        ):
            return records[index]  # type: ignore[return-value]
        return self.samples[index]

    def _sample_count(self) -> int:
        records = self._records
        if records is not None and "samples" not in self.__dict__:
            return len(records)  # a spawned worker's, without the list
        return len(self.samples)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in _STORE:
            state.pop(name, None)
        if context.get_spawning_popen() is None or not self._records_fresh():
            return state  # a cache of this process: made again where needed
        # For a worker process this one starts: the store goes as shared
        # memory, and the lists it holds are left behind.
        state["_records"], state["_records_pid"] = self._records, self._records_pid
        rebuilt = ["samples"]
        if state.get("imgs") is self.samples:
            rebuilt.append("imgs")
        if state.get("targets") == [label for _, label in self.samples]:
            rebuilt.append("targets")
        for name in rebuilt:
            del state[name]
        state["_rebuilt_from_records"] = tuple(rebuilt)
        return state

    def __getattr__(self, name: str) -> Any:
        # Only for what the instance lacks: a list left out of the pickle
        # for a worker process, rebuilt from the store on its first read.
        if name not in self.__dict__.get("_rebuilt_from_records", ()):
            raise AttributeError(
                f"{type(self).__name__!r} object has no attribute {name!r}"
            )
        value: Any
        if name == "samples":
            value = list(self.__dict__["_records"])
        elif name == "imgs":
            value = self.samples
        else:
            value = [label for _, label in self.samples]
        setattr(self, name, value)
        return value
