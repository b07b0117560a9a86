"""BatchSpec: a batch's structure and fields, their layout in a slot, and
the checks that keep every write inside it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import SpecError

FIELD_ALIGN = 64

# A structure: None for a single array leaf, ("tuple", n, children) or
# ("dict", keys, children). Leaves are numbered depth-first.
Structure = Any


@dataclass(frozen=True)
class Field:
    """One leaf of a batch: its name, per-row shape, dtype and slot offset."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    offset: int

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def describe(self) -> str:
        return f"shape {self.shape} dtype {self.dtype}"


_PYTHON_SCALARS = {"b": (bool,), "i": (int,), "u": (int,), "f": (float, int)}


def _direct_types(f: Field) -> frozenset[type]:
    if f.shape != ():
        return frozenset()
    return frozenset((f.dtype.type, *_PYTHON_SCALARS.get(f.dtype.kind, ())))


def _same_rows(name: str, arr: np.ndarray[Any, Any], rows: int | None) -> int:
    """The batch's row count, checking field `name` agrees with the others."""
    if rows is not None and arr.shape[0] != rows:
        raise SpecError(
            f"field {name!r} of a batch: {arr.shape[0]} rows while the fields "
            f"before it have {rows}; every field of a batch needs the same "
            "number of rows"
        )
    return int(arr.shape[0])


def _path(parent: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{parent}[{key}]"
    return f"{parent}.{key}" if parent else str(key)


def _leaf_name(path: str) -> str:
    return path or "batch"


def _structure_of(obj: Any, path: str, leaves: list[tuple[str, Any]]) -> Structure:
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
            tuple(_structure_of(obj[k], _path(path, k), leaves) for k in keys),
        )
    if isinstance(obj, (tuple, list)):
        return (
            "tuple",
            len(obj),
            tuple(_structure_of(v, _path(path, i), leaves) for i, v in enumerate(obj)),
        )
    leaves.append((_leaf_name(path), obj))
    return None


def _as_array(name: str, value: Any) -> np.ndarray[Any, Any]:
    arr = value if type(value) is np.ndarray else np.asarray(value)
    if arr.dtype.hasobject:
        raise SpecError(
            f"field {name!r}: dtype {arr.dtype} (from {type(value).__name__}) "
            "holds Python objects, which cannot live in shared memory; "
            "return numeric numpy arrays or scalars"
        )
    return arr


def _native(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """dtype in this machine's byte order: the order of every field in a
    slot, whatever order the items come in (numpy converts on writing)."""
    return dtype if dtype.isnative else dtype.newbyteorder("=")


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


def _flatten(structure: Structure, obj: Any, out: list[Any]) -> bool:
    if structure is None:
        out.append(obj)
        return True
    kind, key, children = structure
    if kind == "tuple":
        if not isinstance(obj, (tuple, list)) or len(obj) != key:
            return False
        return all(_flatten(c, v, out) for c, v in zip(children, obj))
    if not isinstance(obj, Mapping) or len(obj) != len(key):
        return False
    try:
        return all(_flatten(c, obj[k], out) for c, k in zip(children, key))
    except KeyError:
        return False


def _unflatten(structure: Structure, leaves: Any) -> Any:
    if structure is None:
        return next(leaves)
    kind, key, children = structure
    if kind == "tuple":
        return tuple(_unflatten(c, leaves) for c in children)
    return {k: _unflatten(c, leaves) for k, c in zip(key, children)}


def _describe_structure(structure: Structure) -> str:
    if structure is None:
        return "array"
    kind, key, children = structure
    if kind == "tuple":
        return "(" + ", ".join(_describe_structure(c) for c in children) + ")"
    return (
        "{"
        + ", ".join(f"{k!r}: {_describe_structure(c)}" for k, c in zip(key, children))
        + "}"
    )


class BatchSpec:
    """Fields of a batch with `rows` rows, laid out 64-byte aligned in a slot.

    A map-style item is one row; a callable source's item is a whole batch
    whose leading dimension is the rows.
    """

    def __init__(
        self,
        structure: Structure,
        fields: Sequence[tuple[str, tuple[int, ...], Any]],
        rows: int,
    ) -> None:
        if rows < 1:
            raise SpecError(f"rows must be >= 1, got {rows}")
        self.structure = structure
        self.rows = rows
        laid: list[Field] = []
        offset = 0
        for name, shape, dtype in fields:
            dt = _native(np.dtype(dtype))
            if dt.hasobject:
                raise SpecError(
                    f"field {name!r}: dtype {dt} holds Python objects; use a "
                    "numeric dtype"
                )
            f = Field(name, tuple(int(d) for d in shape), dt, offset)
            if any(d < 0 for d in f.shape):
                raise SpecError(f"field {name!r}: negative dimension in {f.shape}")
            laid.append(f)
            offset += -(-(f.row_bytes * rows) // FIELD_ALIGN) * FIELD_ALIGN
        self.fields = tuple(laid)
        self.slot_bytes = max(offset, FIELD_ALIGN)
        self.row_bytes = sum(f.row_bytes for f in laid)
        # A flat tuple (or one array) of leaves needs no flattening per row.
        self.flat = structure is None or (
            structure[0] == "tuple" and all(c is None for c in structure[2])
        )
        # Scalar types a row may hold as they are, without np.asarray: the
        # dtype's own scalar type, and Python scalars of the same kind
        # (numpy range-checks those on assignment).
        self.direct_types = tuple(_direct_types(f) for f in laid)

    # -------------------------------------------------------- construction

    @classmethod
    def from_sample(cls, sample: Any, rows: int) -> BatchSpec:
        """Infers a spec from one map-style sample: each leaf is one row."""
        leaves: list[tuple[str, Any]] = []
        structure = _structure_of(sample, "", leaves)
        fields = []
        for name, value in leaves:
            arr = _as_array(name, value)
            _refuse_text(name, arr)
            fields.append((name, arr.shape, arr.dtype))
        return cls(structure, fields, rows)

    @classmethod
    def from_batch(cls, batch: Any) -> BatchSpec:
        """Infers a spec from one whole batch of a callable source."""
        leaves: list[tuple[str, Any]] = []
        structure = _structure_of(batch, "", leaves)
        fields = []
        rows = None
        for name, value in leaves:
            arr = _as_array(name, value)
            _refuse_text(name, arr)
            if arr.ndim == 0:
                raise SpecError(
                    f"field {name!r}: a batch leaf needs a leading batch "
                    f"dimension, got a scalar of dtype {arr.dtype}; yield arrays "
                    "whose first dimension is the batch size"
                )
            rows = _same_rows(name, arr, rows)
            fields.append((name, arr.shape[1:], arr.dtype))
        if rows is None or rows == 0:
            raise SpecError("a batch needs at least one field with at least one row")
        return cls(structure, fields, rows)

    @classmethod
    def from_user(cls, spec: Any, rows: int | None) -> BatchSpec:
        """From spec=: {name: (shape, dtype)}, a tuple of (shape, dtype), or
        one (shape, dtype). rows=None: shapes are whole batches (callable
        sources) and their first dimension is the rows."""

        def is_leaf(v: Any) -> bool:
            return (
                isinstance(v, tuple)
                and len(v) == 2
                and isinstance(v[0], (tuple, list, int))
                and not isinstance(v[1], (tuple, list, Mapping))
            )

        def parse(v: Any, path: str, out: list[tuple[str, Any]]) -> Structure:
            if is_leaf(v):
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
                    tuple(parse(v[k], _path(path, k), out) for k in v),
                )
            if isinstance(v, (tuple, list)) and v:
                return (
                    "tuple",
                    len(v),
                    tuple(parse(x, _path(path, i), out) for i, x in enumerate(v)),
                )
            raise SpecError(
                f"spec field {_leaf_name(path)!r}: expected (shape, dtype), a "
                f"dict or a tuple of them, got {v!r}; e.g. spec={{'image': "
                "((3, 224, 224), 'uint8'), 'label': ((), 'int64')}"
            )

        leaves: list[tuple[str, Any]] = []
        structure = parse(spec, "", leaves)
        if rows is not None:
            return cls(structure, [(n, s, d) for n, (s, d) in leaves], rows)
        batch_rows = None
        fields = []
        for name, (shape, dtype) in leaves:
            if len(shape) == 0 or (batch_rows is not None and shape[0] != batch_rows):
                raise SpecError(
                    f"spec field {name!r}: shape {shape} needs the same leading "
                    "batch dimension as every other field (callable sources "
                    "give whole-batch shapes)"
                )
            batch_rows = shape[0]
            fields.append((name, shape[1:], dtype))
        return cls(structure, fields, int(batch_rows or 0))

    # ----------------------------------------------------------- structure

    def flatten(self, item: Any, what: str) -> Sequence[Any]:
        """The item's leaves in field order, or SpecError if its structure
        differs from the spec's."""
        if self.structure is None:
            return (item,)
        if self.flat and type(item) is tuple and len(item) == len(self.fields):
            return item
        out: list[Any] = []
        if not _flatten(self.structure, item, out):
            got: list[tuple[str, Any]] = []
            try:
                got_structure = _describe_structure(_structure_of(item, "", got))
            except SpecError:
                got_structure = type(item).__name__
            raise SpecError(
                f"{what} has structure {got_structure}, expected "
                f"{_describe_structure(self.structure)}; every item must have "
                "the same tuple/dict layout as the first"
            )
        return out

    def unflatten(self, leaves: Sequence[Any]) -> Any:
        if self.structure is None:
            return leaves[0]
        if self.flat:
            return tuple(leaves)
        return _unflatten(self.structure, iter(leaves))

    # ---------------------------------------------------------------- views

    def views(self, buffer: Any, rows: int) -> list[np.ndarray[Any, Any]]:
        """Arrays over the first `rows` rows of each field in `buffer`."""
        return [
            np.ndarray((rows, *f.shape), f.dtype, buffer=buffer, offset=f.offset)
            for f in self.fields
        ]

    # --------------------------------------------------------------- checks

    def check_row(self, i: int, value: Any) -> Any:
        """Field i's value for one row, checked against the spec: an array,
        or a scalar numpy may assign as it is."""
        f = self.fields[i]
        if type(value) in self.direct_types[i]:
            return value
        arr = value if type(value) is np.ndarray else _as_array(f.name, value)
        if arr.shape != f.shape or _native(arr.dtype) != f.dtype:
            raise SpecError(
                f"field {f.name!r} of a sample: expected {f.describe()}, got "
                f"shape {arr.shape} dtype {arr.dtype}; make every item match "
                "the first one, or pass spec= explicitly"
            )
        return arr

    def check_batch(self, i: int, value: Any) -> np.ndarray[Any, Any]:
        """Field i's value for a whole batch; returns it with its row count
        checked against the spec's capacity."""
        f = self.fields[i]
        arr = value if type(value) is np.ndarray else _as_array(f.name, value)
        if arr.shape[1:] != f.shape or _native(arr.dtype) != f.dtype or arr.ndim == 0:
            raise SpecError(
                f"field {f.name!r} of a batch: expected shape "
                f"(<= {self.rows}, {', '.join(map(str, f.shape))}) dtype "
                f"{f.dtype}, got shape {arr.shape} dtype {arr.dtype}; yield "
                "batches shaped like the first one, or pass spec= explicitly"
            )
        if arr.shape[0] > self.rows:
            raise SpecError(
                f"field {f.name!r} of a batch: {arr.shape[0]} rows, more than the "
                f"{self.rows} of the first batch; a slot holds at most that "
                "many, so yield smaller batches or pass spec= with more rows"
            )
        return arr

    def batch_arrays(self, batch: Any) -> tuple[int, list[np.ndarray[Any, Any]]]:
        """A callable source's batch as (rows, one checked array per field)."""
        rows: int | None = None
        arrays = []
        for i, leaf in enumerate(self.flatten(batch, "a batch")):
            arr = self.check_batch(i, leaf)
            rows = _same_rows(self.fields[i].name, arr, rows)
            arrays.append(arr)
        return int(rows or 0), arrays

    def describe(self) -> str:
        return ", ".join(f"{f.name}: {f.describe()}" for f in self.fields)
