"""How the user's objects (the source, worker_init) are pickled for a
spawn or forkserver worker (forked workers inherit them as they are).

cloudpickle, the library Ray, Dask and joblib rely on, so that what a
forked worker would inherit reaches these too: lambdas, local functions
and closures, and classes and functions of a ``__main__`` that no worker
can import (a notebook, ``python -c``, standard input) travel by value;
everything else by reference, as plain pickle does. That includes what a
script file defines at its top level: each worker runs the script again
(as DataLoader's do), so it sees the script's module-level values as they
are after import, not as the training process changed them since. Large
numpy arrays go as shared memory (fastq._workers._shared_arrays).

Handles on something outside the process (open files, sockets) and what
cannot be pickled at all (generators, thread locks) are refused with the
path to them (fastq._workers._object_path); no worker gets a copy of a file's
contents in place of the file, as cloudpickle alone would give it.

multiprocessing's own reducers still apply, so that a Connection, a
Queue or a ``Value``'s shared memory reaches the worker; but torch's
reducers for tensors and storages are left out: each would send one file
descriptor per storage, and a dataset holding a few hundred tensors fails
with CPython's "too many fds" (or exhausts the worker's descriptor table).
Without them, a tensor is pickled by value, as plain pickle does.
"""

from __future__ import annotations

import copyreg
import inspect
import io
import os
import pickle
import reprlib
import socket
import sys
import threading
import types
from collections import ChainMap
from multiprocessing import context, reduction, synchronize
from typing import Any

import cloudpickle

from ..errors import ConfigError
from ._object_path import path_to
from ._shared_arrays import Handoff, PayloadFd

# Reducers registered by these modules send a descriptor per object.
_PER_OBJECT_DESCRIPTORS = ("torch.multiprocessing",)


_THREAD_LOCKS = (type(threading.Lock()), type(threading.RLock()))
_GENERATORS = (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType)
# In memory only: they pickle as what they hold, and that is all they are.
_MEMORY_FILES = (io.StringIO, io.BytesIO)


def _refused_kind(obj: Any) -> str | None:
    """What obj is, if it is something no worker may get by pickling."""
    if isinstance(obj, socket.socket):
        return "a socket"
    if isinstance(obj, io.IOBase) and type(obj) not in _MEMORY_FILES:
        if obj is sys.stdout or obj is sys.stderr:
            return None  # the worker's own stream (cloudpickle): not a copy
        return "an open file"
    if isinstance(obj, _GENERATORS):
        return "a generator"
    if isinstance(obj, _THREAD_LOCKS):
        return "a thread lock"
    return None


class _Refused(pickle.PicklingError):
    def __init__(self, obj: Any, kind: str) -> None:
        super().__init__(f"{kind} cannot be pickled for a worker")
        self.obj = obj
        self.kind = kind


class _WorkerPickler(cloudpickle.Pickler):  # type: ignore[misc]
    def __init__(self, file: Any, protocol: int | None, arrays: Any) -> None:
        self._arrays = arrays
        self._main_by_reference = main_rerun_in_workers()
        # The object handed to reducer_override last: the one whose own
        # reduction failed, when pickling fails (a path names it).
        self.last: Any = None
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
        self.last = obj
        kind = _refused_kind(obj)
        if kind is not None:
            raise _Refused(obj, kind)
        if self._main_by_reference and _defined_in_main(obj):
            return NotImplemented  # plain pickle's reference: __main__.name
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


def main_rerun_in_workers() -> bool:
    """Whether a spawn or forkserver worker runs this process's main module
    again (multiprocessing prepares a child's ``__main__`` from the script's
    path, or from the module ``-m`` named), so that what it defines at its
    top level can be found there by name. Not for ``python -c``, standard
    input, a notebook, a package's ``__main__``, or IPython."""
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if isinstance(name, str):
        return name != "__main__" and not name.endswith(".__main__")
    path = getattr(main, "__file__", None)
    if not isinstance(path, str) or not os.path.isfile(path):
        return False
    return os.path.splitext(os.path.basename(path))[0] != "ipython"


def _defined_in_main(obj: Any) -> bool:
    """obj is a class or function that ``__main__`` names, and defines at
    its top level: a worker's run of the script defines it too. One
    defined in a block (``if __name__ == "__main__":``, where a worker's
    run never goes) keeps travelling by value, where DataLoader's workers
    could not find it."""
    if not isinstance(obj, (type, types.FunctionType)):
        return False
    if getattr(obj, "__module__", None) != "__main__":
        return False
    main = sys.modules.get("__main__")
    found: Any = main
    for part in getattr(obj, "__qualname__", "").split("."):
        found = getattr(found, part, None)
    if found is not obj:
        return False
    outer = getattr(main, obj.__qualname__.split(".")[0])  # a class it is in
    try:
        lines, start = inspect.findsource(outer)
    except (OSError, TypeError):
        return True  # no source to tell by: as DataLoader, by name
    return start < len(lines) and not lines[start][:1].isspace()


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
    pickler = _WorkerPickler(file, pickle.HIGHEST_PROTOCOL, arrays)
    try:
        pickler.dump(objs)
    except _Refused as exc:
        where = path_to(exc.obj, _roots(objs))
        raise ConfigError(_refusal(method, exc.kind, exc.obj, where)) from None
    except (pickle.PicklingError, TypeError, AttributeError, RuntimeError) as exc:
        where = path_to(pickler.last, _roots(objs))
        raise ConfigError(_unpicklable(method, exc, where)) from exc
    finally:
        context.set_spawning_popen(popen)
    return recorder.fds


def _roots(objs: Any) -> dict[str, Any]:
    """The user's objects by the names a path starts from."""
    return dict(zip(("source", "worker_init"), objs))


def _refusal(method: str, kind: str, obj: Any, where: str | None) -> str:
    what = f"{where} is {kind}" if where else f"the source or worker_init holds {kind}"
    if kind in ("an open file", "a socket"):
        why = (
            "a handle on something outside this process, of which a worker "
            "would get a copy of what it held, or nothing"
        )
        fix = (
            "keep what opens it (a path, an address) and open it in the "
            "worker: in worker_init, or on first use (drop the handle in "
            "__getstate__ and reopen it where it is missing)"
        )
    else:
        why = f"{kind.split(' ', 1)[1]}s stay in the process that made them"
        fix = "create it in the worker: in worker_init, or on first use"
    return (
        f"{what} ({_short_repr(obj)}), which cannot be pickled for workers "
        f"started with {method!r}: {why}. Fix: {fix}; or leave start_method "
        "unset (a DataLoader's multiprocessing_context), so that workers "
        "fork and inherit it"
    )


def _short_repr(obj: Any) -> str:
    short = reprlib.Repr()
    short.maxother = 160
    try:
        return short.repr(obj)
    except Exception:  # a __repr__ that fails
        return type(obj).__name__


def _unpicklable(method: str, exc: BaseException, where: str | None) -> str:
    text = f"{type(exc).__name__}: {exc}"
    if where:
        text = f"{where}: {text}"
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
    them needs it; loaded with fastq._workers._shared_arrays.load_for_worker."""
    return Handoff(objs, _dump, beside)
