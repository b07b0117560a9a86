"""What a BatchSpec is made from: one first sample, one first batch, or
spec=; and the errors that say why an item cannot be described."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import SpecError
from ._jagged import Jagged

# A structure: None for a single array leaf, ("tuple", n, children) or
# ("dict", keys, children). Leaves are numbered depth-first.
Structure = Any

# What BatchSpec's constructor takes: a structure, its leaves' fields
# ((name, shape, dtype), or (name, row shape, dtype, Jagged)), and rows.
Described = tuple[Structure, list[tuple[Any, ...]], int]


def sample_fields(sample: Any, rows: int) -> Described:
    """A map-style sample's fields: each leaf is one row."""
    leaves: list[tuple[str, Any]] = []
    structure = structure_of(sample, "", leaves)
    fields: list[tuple[Any, ...]] = []
    for name, value in leaves:
        arr = as_array(name, value)
        _refuse_text(name, arr)
        fields.append((name, arr.shape, arr.dtype))
    return structure, fields, rows


def batch_fields(batch: Any) -> Described:
    """A callable source's whole batch's fields and rows."""
    leaves: list[tuple[str, Any]] = []
    structure = structure_of(batch, "", leaves)
    fields: list[tuple[Any, ...]] = []
    rows = None
    for name, value in leaves:
        arr = as_array(name, value)
        _refuse_text(name, arr)
        if arr.ndim == 0:
            raise SpecError(
                f"field {name!r}: a batch leaf needs a leading batch "
                f"dimension, got a scalar of dtype {arr.dtype}; yield arrays "
                "whose first dimension is the batch size"
            )
        rows = same_rows(name, arr, rows)
        fields.append((name, arr.shape[1:], arr.dtype))
    if rows is None or rows == 0:
        raise SpecError("a batch needs at least one field with at least one row")
    return structure, fields, rows


def user_fields(spec: Any, rows: int | None) -> Described:
    """spec='s fields; rows=None: its shapes are whole batches (callable
    sources) and their first dimension is the rows."""
    leaves: list[tuple[str, Any]] = []
    structure = _parse(spec, "", leaves)
    if rows is not None:
        return structure, [_declared(n, v) for n, v in leaves], rows
    batch_rows = None
    fields: list[tuple[Any, ...]] = []
    for name, declared in leaves:
        if isinstance(declared, Jagged):
            fields.append(_declared(name, declared))
            continue
        shape, dtype = declared
        if len(shape) == 0 or (batch_rows is not None and shape[0] != batch_rows):
            raise SpecError(
                f"spec field {name!r}: shape {shape} needs the same leading "
                "batch dimension as every other field (callable sources "
                "give whole-batch shapes)"
            )
        batch_rows = shape[0]
        fields.append((name, shape[1:], dtype))
    if batch_rows is None:
        raise SpecError(
            "spec: every field is jagged, so nothing gives a whole batch's "
            "samples; pass batch_size (a stream of samples), or declare a "
            "fixed field with the batch's leading dimension"
        )
    return structure, fields, int(batch_rows)


def structure_of(obj: Any, path: str, leaves: list[tuple[str, Any]]) -> Structure:
    """obj's structure; its leaves, named by their paths, go to `leaves`."""
    if isinstance(obj, Mapping):
        keys = tuple(obj.keys())
        for k in keys:
            if not isinstance(k, str):
                raise SpecError(
                    f"field {_leaf_name(path)!r}: dict keys must be str, got "
                    f"{k!r} ({type(k).__name__}); use string keys"
                )
        return (
            "dict",
            keys,
            tuple(structure_of(obj[k], _path(path, k), leaves) for k in keys),
        )
    if isinstance(obj, (tuple, list)):
        return (
            "tuple",
            len(obj),
            tuple(structure_of(v, _path(path, i), leaves) for i, v in enumerate(obj)),
        )
    leaves.append((_leaf_name(path), obj))
    return None


def as_array(name: str, value: Any) -> np.ndarray[Any, Any]:
    arr = value if type(value) is np.ndarray else np.asarray(value)
    if arr.dtype.hasobject:
        raise SpecError(
            f"field {name!r}: dtype {arr.dtype} (from {type(value).__name__}) "
            "holds Python objects, which cannot live in shared memory; "
            "return numeric numpy arrays or scalars"
        )
    return arr


def same_rows(name: str, arr: np.ndarray[Any, Any], rows: int | None) -> int:
    """The batch's row count, checking field `name` agrees with the others."""
    if rows is not None and arr.shape[0] != rows:
        raise SpecError(
            f"field {name!r} of a batch: {arr.shape[0]} rows while the fields "
            f"before it have {rows}; every field of a batch needs the same "
            "number of rows"
        )
    return int(arr.shape[0])


def _refuse_text(name: str, arr: np.ndarray[Any, Any]) -> None:
    """A spec is inferred from one item; strings vary in length from item
    to item, while a slot's field has one fixed size."""
    if arr.dtype.kind in "SU":
        what = "str" if arr.dtype.kind == "U" else "bytes"
        raise SpecError(
            f"field {name!r}: {what} values (dtype {arr.dtype}) cannot live in "
            "a Prefetcher's fixed-shape numeric slots, as their length varies "
            "from item to item. Encode the field as a fixed-size numeric array "
            "(label or token ids, or the bytes in a padded uint8 array), or "
            "use fastq.torch.DataLoader, which carries strings beside the arrays"
        )


def _is_leaf(v: Any) -> bool:
    """A spec= leaf: (shape, dtype)."""
    return (
        isinstance(v, tuple)
        and len(v) == 2
        and isinstance(v[0], (tuple, list, int))
        and not isinstance(v[1], (tuple, list, Mapping))
    )


def _parse(v: Any, path: str, out: list[tuple[str, Any]]) -> Structure:
    """spec='s structure; its leaves, (shape, dtype) or Jagged, go to `out`."""
    if isinstance(v, Jagged):
        out.append((_leaf_name(path), v.checked(_leaf_name(path))))
        return None
    if _is_leaf(v):
        shape = (v[0],) if isinstance(v[0], int) else tuple(v[0])
        try:
            dtype = np.dtype(v[1])
        except TypeError as exc:
            raise SpecError(
                f"spec field {_leaf_name(path)!r}: {v[1]!r} is not a "
                "numpy dtype; give e.g. 'float32' or np.uint8"
            ) from exc
        out.append((_leaf_name(path), (shape, dtype)))
        return None
    if isinstance(v, Mapping) and v:
        return (
            "dict",
            tuple(v),
            tuple(_parse(v[k], _path(path, k), out) for k in v),
        )
    if isinstance(v, (tuple, list)) and v:
        return (
            "tuple",
            len(v),
            tuple(_parse(x, _path(path, i), out) for i, x in enumerate(v)),
        )
    raise SpecError(
        f"spec field {_leaf_name(path)!r}: expected (shape, dtype), a "
        f"dict or a tuple of them, got {v!r}; e.g. spec={{'image': "
        "((3, 224, 224), 'uint8'), 'label': ((), 'int64')}"
    )


def _declared(name: str, declared: Any) -> tuple[Any, ...]:
    """A field of BatchSpec from a parsed spec= leaf."""
    if isinstance(declared, Jagged):
        return (name, declared.inner, declared.dtype, declared)
    shape, dtype = declared
    return (name, shape, dtype)


def _path(parent: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{parent}[{key}]"
    return f"{parent}.{key}" if parent else str(key)


def _leaf_name(path: str) -> str:
    return path or "batch"
