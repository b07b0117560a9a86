"""Where an object sits inside the user's objects, as a path a user can
read (``dataset.files[2]``): errors about one object name it this way."""

from __future__ import annotations

import functools
import types
from collections import deque
from collections.abc import Iterator
from typing import Any

# A bound on the objects visited: the search runs once, on an error path,
# and gives up (no path) rather than walk a huge dataset.
_MAX_VISITS = 200_000


def path_to(target: Any, roots: dict[str, Any]) -> str | None:
    """The shortest path from one of ``roots`` (name -> object) to
    ``target``, breadth first; None if it is not found within the bound.
    An object whose class sets ``_path_transparent`` (a wrapper fastq put
    around the user's objects) adds no name: its attributes read as roots."""
    queue: deque[tuple[Any, str]] = deque()
    for name, root in roots.items():
        if _transparent(root):
            queue.extend((child, step.lstrip(".")) for step, child in _children(root))
        else:
            queue.append((root, name))
    seen: set[int] = set()
    while queue and len(seen) < _MAX_VISITS:
        obj, path = queue.popleft()
        if obj is target:
            return path
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        queue.extend((child, path + step) for step, child in _children(obj))
    return None


def _transparent(obj: Any) -> bool:
    return bool(getattr(type(obj), "_path_transparent", False))


def _children(obj: Any) -> Iterator[tuple[str, Any]]:
    """(step, child) for what pickling obj would reach, as far as it is
    plain to see: items, attributes, a function's closure and the globals
    of a function sent by value."""
    if isinstance(obj, (str, bytes, int, float, complex, bool, type(None))):
        return
    if isinstance(obj, (types.ModuleType, type)):
        return  # sent by reference, or a class's methods: not the user's data
    if isinstance(obj, dict):
        for key, value in list(obj.items()):
            yield f"[{key!r}]", value
        return
    if isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield f"[{i}]", value
        return
    if isinstance(obj, (set, frozenset)):
        for value in list(obj):
            yield "[...]", value
        return
    if isinstance(obj, types.MethodType):
        yield ".__self__", obj.__self__
        return
    if isinstance(obj, functools.partial):
        yield ".func", obj.func
        yield from ((f".args[{i}]", a) for i, a in enumerate(obj.args))
        yield from ((f".keywords[{k!r}]", v) for k, v in obj.keywords.items())
        return
    if isinstance(obj, types.FunctionType):
        code = obj.__code__
        for name, cell in zip(code.co_freevars, obj.__closure__ or ()):
            try:
                yield f" (its closure's {name})", cell.cell_contents
            except ValueError:  # an empty cell
                continue
        if "<" in obj.__qualname__:  # a lambda or a local function: by value
            for name in code.co_names:
                if name in obj.__globals__:
                    yield f" (its global {name})", obj.__globals__[name]
        return
    attrs = getattr(obj, "__dict__", None)
    if isinstance(attrs, dict):
        for key, value in list(attrs.items()):
            yield f".{key}", value
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name in ("__dict__", "__weakref__"):
                continue
            try:
                yield f".{name}", getattr(obj, name)
            except AttributeError:
                continue
