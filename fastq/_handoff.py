"""How the user's objects (the source, worker_init) are pickled for a
spawn or forkserver worker (forked workers inherit them as they are).

cloudpickle, the library Ray, Dask and joblib rely on, so that what a
forked worker would inherit reaches these too: lambdas, local functions
and closures, and classes and functions of a ``__main__`` that no worker
can import (a notebook, ``python -c``) travel by value; everything else by
reference, as plain pickle does. Large numpy arrays go as shared memory
(fastq._shared_arrays).

multiprocessing's own reducers still apply, so that a Connection, a
Queue or a ``Value``'s shared memory reaches the worker; but torch's
reducers for tensors and storages are left out: each would send one file
descriptor per storage, and a dataset holding a few hundred tensors fails
with CPython's "too many fds" (or exhausts the worker's descriptor table).
Without them, a tensor is pickled by value, as plain pickle does.
"""

from __future__ import annotations

import copyreg
import pickle
from collections import ChainMap
from multiprocessing import context, reduction, synchronize
from typing import Any

import cloudpickle

from ._shared_arrays import Handoff, PayloadFd
from .errors import ConfigError

# Reducers registered by these modules send a descriptor per object.
_PER_OBJECT_DESCRIPTORS = ("torch.multiprocessing",)


class _WorkerPickler(cloudpickle.Pickler):  # type: ignore[misc]
    def __init__(self, file: Any, protocol: int | None, arrays: Any) -> None:
        self._arrays = arrays
        extra = reduction.ForkingPickler._extra_reducers  # type: ignore[attr-defined]
        descriptors = {
            cls: reducer
            for cls, reducer in extra.items()
            if not (getattr(reducer, "__module__", "") or "").startswith(
                _PER_OBJECT_DESCRIPTORS
            )
        }
        # Set before the base class's __init__, which reads it once.
        self.dispatch_table = ChainMap(
            descriptors, cloudpickle.Pickler._dispatch_table, copyreg.dispatch_table
        )
        super().__init__(file, protocol)

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, synchronize.SemLock) and _unlinked(obj):
            # Made with the fork context: its semaphore was unlinked at
            # once, so nothing but a fork can share it (CPython 3.11+ says
            # so; before, the worker would get a dangling handle).
            raise pickle.PicklingError(
                f"a multiprocessing {type(obj).__name__} created in a fork context"
            )
        reduced = self._arrays.reduce(obj)
        if reduced is NotImplemented:
            return super().reducer_override(obj)
        return reduced


def _unlinked(lock: Any) -> bool:
    """A SemLock's semaphore has no name left to reopen it by."""
    return getattr(lock._semlock, "name", None) is None


class _DescriptorRecorder:
    """Stands in for the spawning Popen while the objects are pickled once
    for every worker: a descriptor a reducer duplicates (a ``Value``'s
    arena, a Queue's pipe) is recorded, and the pickle names its place
    among the payload's descriptors, of which each worker is then passed
    its own duplicates. (The Popen's own list would serve its worker only.)"""

    def __init__(self) -> None:
        self.fds: list[int] = []

    def duplicate_for_child(self, fd: int) -> int:
        self.fds.append(fd)
        return len(self.fds) - 1

    @staticmethod
    def DupFd(index: int) -> PayloadFd:
        return PayloadFd(index)


def _dump(objs: Any, file: Any, arrays: Any) -> list[int]:
    """Pickles objs into file; the descriptors the pickle refers to."""
    popen = context.get_spawning_popen()
    method = getattr(popen, "method", None) or "spawn"
    recorder = _DescriptorRecorder()
    context.set_spawning_popen(recorder)  # type: ignore[arg-type]
    try:
        _WorkerPickler(file, pickle.HIGHEST_PROTOCOL, arrays).dump(objs)
    except (pickle.PicklingError, TypeError, AttributeError, RuntimeError) as exc:
        raise ConfigError(_unpicklable(method, exc)) from exc
    finally:
        context.set_spawning_popen(popen)
    return recorder.fds


def _unpicklable(method: str, exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    if "fork context" in str(exc):
        fix = (
            "it holds a multiprocessing object (a Lock, Value, Queue...) made "
            "with the 'fork' context, which only forked workers can share: "
            "leave start_method unset (workers fork by default), or make the "
            f"object with multiprocessing.get_context({method!r})"
        )
    else:
        fix = (
            "open files, sockets, generators and thread locks cannot cross "
            "into a new process: open or create them in the worker (in "
            "worker_init, or on first use); or leave start_method unset, so "
            "that workers fork and inherit them"
        )
    return (
        f"the source or worker_init cannot be pickled for start_method="
        f"{method!r} workers ({text}): {fix}"
    )


def handoff_for_workers(objs: Any, beside: bool = True) -> Handoff:
    """objs, pickled once for all of a pool's workers when the first of
    them needs it; loaded with fastq._shared_arrays.load_for_worker."""
    return Handoff(objs, _dump, beside)
