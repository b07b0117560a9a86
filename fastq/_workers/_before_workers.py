"""What the user's objects do as worker processes are about to start: a
dataset that defines ``_fastq_before_workers`` moves what its workers read
into shared memory there, and names what they then never read."""

from __future__ import annotations

from collections import deque
from typing import Any

from ._object_path import _children, _transparent
from ._shared_records import shared_records

# The hook's name: fastq.vision's datasets define it (a layer below this
# one, they get shared_records from here).
HOOK = "_fastq_before_workers"
# Bounds of the walk to the datasets, as the copied-data walk's: objects
# visited, and the size of a container not looked into (a dataset is an
# attribute, an item of a few, not one of a million records).
_MAX_VISITS = 500
_LOOKED_INTO_BELOW = 128

_ATOMS = (str, bytes, bytearray, int, float, complex, bool, type(None))


def before_workers_start(objs: dict[str, Any]) -> dict[int, frozenset[str]]:
    """Calls ``_fastq_before_workers(fastq.shared_records)`` on each object
    within ``objs`` (name -> the user's object) whose class defines it,
    once each, in the process that starts the workers.

    Returns
    -------
    dict
        id(object) -> the attributes it says its workers never read (what
        the copied-data warning leaves out).
    """
    queue: deque[Any] = deque()
    for root in objs.values():
        if _transparent(root):
            queue.extend(child for _, child in _children(root))
        else:
            queue.append(root)
    seen: set[int] = set()
    unread: dict[int, frozenset[str]] = {}
    while queue and len(seen) < _MAX_VISITS:
        obj = queue.popleft()
        if isinstance(obj, _ATOMS) or id(obj) in seen:
            continue
        seen.add(id(obj))
        hook = getattr(type(obj), HOOK, None)
        if callable(hook):
            unread[id(obj)] = frozenset(hook(obj, shared_records))
        if _too_large_to_look_into(obj):
            continue
        try:
            queue.extend(child for _, child in _children(obj))
        except Exception:  # a user's object whose attributes or items fail
            continue  # what it holds is not looked into: never what stops a start
    return unread


def _too_large_to_look_into(obj: Any) -> bool:
    try:
        return isinstance(obj, (list, tuple, dict, set, frozenset)) and (
            len(obj) >= _LOOKED_INTO_BELOW
        )
    except Exception:  # a subclass whose len() fails
        return True


__all__ = ["HOOK", "before_workers_start"]
