"""How the user's objects (the source, worker_init) are pickled for a
spawn or forkserver worker.

multiprocessing's ForkingPickler, so that descriptors inside them (a
Connection, a SharedFd) still reach the worker; but torch's reducers for
tensors and storages are left out: each would send one file descriptor per
storage, and a dataset holding a few hundred tensors fails with CPython's
"too many fds" (or exhausts the worker's descriptor table). Without them,
a tensor is pickled by value, as plain pickle does.
"""

from __future__ import annotations

import copyreg
import io
import pickle
from multiprocessing import reduction
from typing import Any

# Reducers registered by these modules send a descriptor per object.
_PER_OBJECT_DESCRIPTORS = ("torch.multiprocessing",)


class _WorkerPickler(reduction.ForkingPickler):
    def __init__(self, file: Any, protocol: int | None = None) -> None:
        super().__init__(file, protocol)
        table = dict(copyreg.dispatch_table)
        extra = reduction.ForkingPickler._extra_reducers  # type: ignore[attr-defined]
        for cls, reducer in extra.items():
            module = getattr(reducer, "__module__", "") or ""
            if not module.startswith(_PER_OBJECT_DESCRIPTORS):
                table[cls] = reducer
        self.dispatch_table = table


def dumps_for_worker(obj: Any) -> bytes:
    """obj pickled for a worker; loaded with pickle.loads there."""
    buf = io.BytesIO()
    _WorkerPickler(buf, pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()
