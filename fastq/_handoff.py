"""How the user's objects (the source, worker_init) are pickled for a
spawn or forkserver worker.

multiprocessing's ForkingPickler, so that descriptors inside them (a
Connection, a SharedFd) still reach the worker; but torch's reducers for
tensors and storages are left out: each would send one file descriptor per
storage, and a dataset holding a few hundred tensors fails with CPython's
"too many fds" (or exhausts the worker's descriptor table). Without them,
a tensor is pickled by value, as plain pickle does. Large numpy arrays go
as shared memory instead (fastq._shared_arrays).
"""

from __future__ import annotations

import copyreg
from multiprocessing import reduction
from typing import Any

from ._shared_arrays import Handoff

# Reducers registered by these modules send a descriptor per object.
_PER_OBJECT_DESCRIPTORS = ("torch.multiprocessing",)


class _WorkerPickler(reduction.ForkingPickler):
    def __init__(self, file: Any, protocol: int | None, arrays: Any) -> None:
        super().__init__(file, protocol)
        self._arrays = arrays
        table = dict(copyreg.dispatch_table)
        extra = reduction.ForkingPickler._extra_reducers  # type: ignore[attr-defined]
        for cls, reducer in extra.items():
            module = getattr(reducer, "__module__", "") or ""
            if not module.startswith(_PER_OBJECT_DESCRIPTORS):
                table[cls] = reducer
        self.dispatch_table = table

    def reducer_override(self, obj: Any) -> Any:
        return self._arrays.reduce(obj)


def handoff_for_workers(objs: Any) -> Handoff:
    """objs, pickled once for all of a pool's workers when the first of
    them needs it; loaded with fastq._shared_arrays.load_for_worker."""
    return Handoff(objs, _WorkerPickler)
