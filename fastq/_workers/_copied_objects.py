"""Large lists and dicts of Python objects that every worker would copy,
found when workers start and named once, with the fix:
NOTE [ Containers that workers copy ]."""

from __future__ import annotations

import itertools
import os
import sys
import types
import warnings
from collections import deque
from collections.abc import Collection, Iterator, Mapping
from typing import Any

import numpy as np

from ..errors import CopiedDataWarning
from ._object_path import _children, _transparent
from ._shared_records import SharedRecords

# NOTE [ Containers that workers copy ]
#
# A forked worker that reads a Python object writes its reference count
# (and the garbage collector writes its header), so every page of objects
# it reads becomes its own: a list of a million records read in a shuffled
# epoch ends up copied into every worker. A spawned worker gets a copy at
# start. Numpy arrays (but those of dtype object) and shared records are
# not copied this way (their data holds no Python objects), so they are
# not counted.
#
# The walk is bounded so that a dataset without large containers costs its
# start nothing measurable: breadth first from the source and worker_init,
# at most _MAX_VISITS objects, never into a container of _SAMPLED_FROM items
# or more; such a container is sized from _SAMPLE of its items, each
# measured to a bounded depth. It warns from WARN_AT_BYTES.
#
# What a dataset says its workers never read is left out: fastq.vision's
# datasets keep ``samples`` as torchvision's list for the user and give
# their workers a copy in shared memory, made as they start
# (``_fastq_before_workers``, fastq/_workers/_before_workers.py), so they
# name ``samples``, ``imgs`` and ``targets`` (NOTE [ Samples the workers
# do not copy ] in fastq/vision/_shared_samples.py). Nothing is left out
# for a subclass that overrides their ``__getitem__``, which may read the
# list, nor where the store could not be made.
#
# fastq does not convert such a container itself, though it could before
# the fork. A shared record is a new copy at every read, so a dataset that
# writes into its records (a cache, a counter), appends to the list, tests
# isinstance(x, list) or relies on two attributes naming the same object
# would change behaviour silently; and the conversion pickles the whole
# list at every start. Only the user knows that none of it applies.

WARN_AT_BYTES = 64 << 20
_SAMPLED_FROM = 128
_SAMPLE = 32
_MAX_VISITS = 500
_MEASURE_DEPTH = 4
_MEASURE_ITEMS = 64  # of a container inside a sampled item

_ATOMS = (str, bytes, bytearray, int, float, complex, bool, type(None))
_NOT_COPIED = (np.ndarray, SharedRecords, types.ModuleType, type)

# (path, items) already named in this process: each is named once.
_warned: set[tuple[str, int]] = set()


class Copied:
    """A container every worker would copy: where it is, how many items,
    its estimated bytes and what its items are."""

    def __init__(self, path: str, obj: Any, nbytes: int) -> None:
        self.path = path
        self.kind = type(obj).__name__
        if isinstance(obj, np.ndarray):
            self.kind = "numpy array (dtype object)"
        self.items = _count(obj)
        self.nbytes = nbytes
        self.numbers_or_strings = isinstance(obj, (list, tuple, np.ndarray)) and all(
            isinstance(x, _ATOMS) and x is not None for x in _sample(obj)
        )
        self.is_dict = isinstance(obj, dict)


def warn_of_copied_objects(
    objs: dict[str, Any],
    start_method: str,
    unread: Mapping[int, Collection[str]] | None = None,
) -> None:
    """Warns (CopiedDataWarning) once for each large container of Python
    objects that ``objs`` (name -> the user's object) hold; ``unread``:
    id(object) -> its attributes that workers never read, left out."""
    try:
        found_all = copied_objects(objs, unread)
    except Exception:  # a user's container whose len() or items fail
        return  # advice only: never what stops workers from starting
    for found in found_all:
        key = (found.path, found.items)
        if key in _warned:
            continue
        _warned.add(key)
        warnings.warn(
            _message(found, start_method),
            CopiedDataWarning,
            stacklevel=_user_stacklevel(),
        )


def copied_objects(
    objs: dict[str, Any], unread: Mapping[int, Collection[str]] | None = None
) -> list[Copied]:
    """The large containers of Python objects ``objs`` hold, by the path to
    each, but for the attributes ``unread`` names (id(object) -> names):
    NOTE [ Containers that workers copy ]."""
    unread = unread or {}
    queue: deque[tuple[Any, str]] = deque()
    for name, root in objs.items():
        if _transparent(root):
            queue.extend((child, step.lstrip(".")) for step, child in _children(root))
        else:
            queue.append((root, name))
    seen: set[int] = set()
    found = []
    while queue and len(seen) < _MAX_VISITS:
        obj, path = queue.popleft()
        if id(obj) in seen or isinstance(obj, _ATOMS):
            continue
        if isinstance(obj, _NOT_COPIED) and not _holds_objects(obj):
            continue
        seen.add(id(obj))
        if _is_container(obj) and _count(obj) >= _SAMPLED_FROM:
            nbytes = _estimated_bytes(obj)
            if nbytes >= WARN_AT_BYTES:
                found.append(Copied(path, obj, nbytes))
            continue
        skipped = {"." + name for name in unread.get(id(obj), ())}
        queue.extend(
            (child, path + step)
            for step, child in _children(obj)
            if not isinstance(child, _ATOMS) and step not in skipped
        )
    return found


def _is_container(obj: Any) -> bool:
    return isinstance(obj, (list, tuple, dict, set, frozenset)) or _holds_objects(obj)


def _holds_objects(obj: Any) -> bool:
    """A numpy array of Python objects (a pandas column of strings): its
    items are copied as a list's are."""
    return isinstance(obj, np.ndarray) and obj.dtype.hasobject


def _count(obj: Any) -> int:
    return int(obj.size) if isinstance(obj, np.ndarray) else len(obj)


def _sample(obj: Any) -> list[Any]:
    """Up to _SAMPLE items, evenly spread where they can be indexed (a
    dict's or a set's first ones: reaching others costs a pass)."""
    if isinstance(obj, np.ndarray):
        step = max(1, obj.size // _SAMPLE)
        return [obj.flat[i] for i in range(0, obj.size, step)][:_SAMPLE]
    if isinstance(obj, (list, tuple)):
        step = max(1, len(obj) // _SAMPLE)
        return [obj[i] for i in range(0, len(obj), step)][:_SAMPLE]
    if isinstance(obj, dict):
        return [(k, v) for k, v in itertools.islice(obj.items(), _SAMPLE)]
    return list(itertools.islice(obj, _SAMPLE))


def _estimated_bytes(container: Any) -> int:
    sample = _sample(container)
    if not sample:
        return sys.getsizeof(container)
    per_item = sum(_measure(x, _MEASURE_DEPTH) for x in sample) / len(sample)
    if isinstance(container, dict):
        per_item -= sys.getsizeof(sample[0])  # the (key, value) pair is ours
    return int(sys.getsizeof(container) + per_item * _count(container))


def _measure(obj: Any, depth: int) -> int:
    """An object's bytes with what it holds, to ``depth`` levels, a bounded
    number of items each (the rest counted as the average of those)."""
    if isinstance(obj, np.ndarray) and not obj.dtype.hasobject:
        return sys.getsizeof(np.empty(0))  # its data is not copied by a read
    size = sys.getsizeof(obj)
    if depth == 0 or isinstance(obj, _ATOMS + _NOT_COPIED):
        return size
    if isinstance(obj, dict):
        items: list[Any] = list(itertools.islice(obj.items(), _MEASURE_ITEMS))
        # A record's str keys are most often one object for all records (a
        # literal, or json's memo), not copies of their own.
        children: Iterator[Any] = itertools.chain.from_iterable(
            (v,) if isinstance(k, str) else (k, v) for k, v in items
        )
        count = len(obj)
    elif _is_container(obj):
        items = list(itertools.islice(obj, _MEASURE_ITEMS))
        children, count = iter(items), len(obj)
    else:
        attrs = getattr(obj, "__dict__", None)
        if not isinstance(attrs, dict):
            return size
        return size + _measure(attrs, depth - 1)
    measured = sum(_measure(child, depth - 1) for child in children)
    if items and count > len(items):
        measured = measured * count // len(items)
    return size + measured


def _message(found: Copied, start_method: str) -> str:
    how = (
        "a forked worker copies the pages of every object it reads (reading "
        "one writes its reference count)"
        if start_method == "fork"
        else f"a worker started with {start_method!r} gets its own copy"
    )
    target = found.path
    for root in ("source.", "dataset."):
        if target.startswith(root):
            target = "self." + target[len(root) :]
    items = target + (".tolist()" if found.kind.startswith("numpy") else "")
    if found.is_dict:
        fix = (
            f"{target} = fastq.shared_records({items}.values()), with its "
            "keys as positions"
        )
    elif found.numbers_or_strings:
        fix = f"{target} = fastq.shared_array({items})"
    else:
        fix = f"{target} = fastq.shared_records({items})"
    return (
        f"{found.path} is a {found.kind} of {found.items:,} Python objects "
        f"(about {_mib(found.nbytes)}) that every worker copies: {how}, up to "
        f"about {_mib(found.nbytes)} per worker over an epoch. Fix, where "
        f"the dataset is made: {fix} (one copy in shared memory, read by "
        "every worker)"
    )


def _mib(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):,.0f} MiB"


_FASTQ_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# What starts workers on the user's behalf: the user's own line is the first
# frame outside these.
_LOADER_DIRS = (
    os.sep + os.path.join("torch", "utils", "data") + os.sep,
    os.sep + "multiprocessing" + os.sep,
)


def _user_stacklevel() -> int:
    """warnings.warn's stacklevel for the first frame (of its caller's
    callers) outside fastq and the loaders' own libraries: the user's line
    that started the workers."""
    frame = sys._getframe(2)
    level = 2
    while frame.f_back is not None and _in_library(frame.f_code.co_filename):
        frame = frame.f_back
        level += 1
    return level


def _in_library(filename: str) -> bool:
    return filename.startswith(_FASTQ_DIR) or any(d in filename for d in _LOADER_DIRS)


__all__ = ["WARN_AT_BYTES", "Copied", "copied_objects", "warn_of_copied_objects"]
