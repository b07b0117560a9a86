"""BatchSpec: a batch's structure and fields, their layout in a slot, and
the checks that keep every write inside it."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._core._ring import BATCH_ARRAY, BATCH_CALL, BATCH_DICT, BATCH_TUPLE, BatchViews
from ..errors import SpecError
from ._jagged import (
    Jagged,
    JaggedArray,
    JaggedLayout,
    batch_value,
    over_budget,
    sample_rows,
)
from ._spec_infer import (
    Structure,
    as_array,
    batch_fields,
    same_rows,
    sample_fields,
    structure_of,
    user_fields,
)

FIELD_ALIGN = 64


@dataclass(frozen=True)
class Field:
    """One leaf of a batch: its name, per-row shape, dtype and slot offset.
    A jagged field's shape is that of each of its values' rows, and
    `offset` is where its offsets lie (its values follow, `jagged`)."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    offset: int
    jagged: JaggedLayout | None = None

    @property
    def row_bytes(self) -> int:
        """A fixed field's bytes per sample; a jagged field's per value row."""
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def describe(self) -> str:
        if self.jagged is not None:
            return (
                f"jagged, up to {self.jagged.max_len} rows of shape {self.shape} "
                f"dtype {self.dtype} a sample, {self.jagged.budget} a batch"
            )
        return f"shape {self.shape} dtype {self.dtype}"


_PYTHON_SCALARS = {"b": (bool,), "i": (int,), "u": (int,), "f": (float, int)}


def _direct_types(f: Field) -> frozenset[type]:
    if f.shape != ():
        return frozenset()
    return frozenset((f.dtype.type, *_PYTHON_SCALARS.get(f.dtype.kind, ())))


def _aligned(nbytes: int) -> int:
    return -(-nbytes // FIELD_ALIGN) * FIELD_ALIGN


def _same_count(name: str, n: int, rows: int | None, capacity: int) -> int:
    """A jagged field's samples in a batch, checked as same_rows does."""
    if rows is not None and n != rows:
        raise SpecError(
            f"field {name!r} of a batch: {n} samples while the fields before "
            f"it have {rows}; every field of a batch needs the same number"
        )
    if n > capacity:
        raise SpecError(
            f"field {name!r} of a batch: {n} samples, more than the {capacity} "
            "a slot holds; yield smaller batches or pass spec= with more rows"
        )
    return n


def _native(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """dtype in this machine's byte order: the order of every field in a
    slot, whatever order the items come in (numpy converts on writing)."""
    return dtype if dtype.isnative else dtype.newbyteorder("=")


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
        fields: Sequence[tuple[Any, ...]],
        rows: int,
    ) -> None:
        """`fields`: (name, shape, dtype), or (name, row shape, dtype,
        Jagged) for a variable-length field."""
        if rows < 1:
            raise SpecError(f"rows must be >= 1, got {rows}")
        self.structure = structure
        self.rows = rows
        laid: list[Field] = []
        offset = 0
        for name, shape, dtype, *declared in fields:
            dt = _native(np.dtype(dtype))
            if dt.hasobject:
                raise SpecError(
                    f"field {name!r}: dtype {dt} holds Python objects; use a "
                    "numeric dtype"
                )
            f = Field(name, tuple(int(d) for d in shape), dt, offset)
            if any(d < 0 for d in f.shape):
                raise SpecError(f"field {name!r}: negative dimension in {f.shape}")
            if declared and declared[0] is not None:
                # Offsets, then `budget` rows of values.
                jag: Jagged = declared[0]
                budget = jag.budget or rows * jag.max_len
                values_at = offset + _aligned(8 * (rows + 1))
                f = Field(
                    name,
                    f.shape,
                    dt,
                    offset,
                    JaggedLayout(jag.max_len, budget, values_at),
                )
                offset = values_at + _aligned(f.row_bytes * budget)
            else:
                offset += _aligned(f.row_bytes * rows)
            laid.append(f)
        self.fields = tuple(laid)
        self.slot_bytes = max(offset, FIELD_ALIGN)
        # Bytes a full batch's fixed fields hold (jagged ones vary).
        self.row_bytes = sum(f.row_bytes for f in laid if f.jagged is None)
        self.jagged = any(f.jagged is not None for f in laid)
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
        return cls(*sample_fields(sample, rows))

    @classmethod
    def from_batch(cls, batch: Any) -> BatchSpec:
        """Infers a spec from one whole batch of a callable source."""
        return cls(*batch_fields(batch))

    @classmethod
    def from_user(cls, spec: Any, rows: int | None) -> BatchSpec:
        """From spec=: {name: (shape, dtype)}, a tuple of (shape, dtype), or
        one (shape, dtype). rows=None: shapes are whole batches (callable
        sources) and their first dimension is the rows."""
        return cls(*user_fields(spec, rows))

    def same_layout(self, other: BatchSpec) -> bool:
        """Whether a batch laid out by ``other`` is one laid out by this."""
        return (
            self.structure == other.structure
            and self.fields == other.fields
            and self.rows == other.rows
        )

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
                got_structure = _describe_structure(structure_of(item, "", got))
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

    def batch_views(self, finish: Callable[[list[Any]], Any] | None) -> BatchViews:
        """The consumer's compiled maker of this spec's batches (fixed
        fields only) over a slot: one array, a flat tuple or a flat dict is
        made in C; otherwise ``finish(arrays)``, or ``unflatten``, makes the
        batch of the field arrays."""
        fields = [(f.offset, f.shape, f.dtype) for f in self.fields]
        structure = self.structure
        if finish is None:
            if structure is None:
                return BatchViews(fields, BATCH_ARRAY, row_bytes=self.row_bytes)
            if self.flat:
                return BatchViews(fields, BATCH_TUPLE, row_bytes=self.row_bytes)
            if structure[0] == "dict" and all(c is None for c in structure[2]):
                return BatchViews(
                    fields, BATCH_DICT, keys=structure[1], row_bytes=self.row_bytes
                )
            finish = self.unflatten
        return BatchViews(fields, BATCH_CALL, finish=finish, row_bytes=self.row_bytes)

    # ---------------------------------------------------------------- views

    def views(self, buffer: Any, rows: int, capacity: bool = False) -> list[Any]:
        """Arrays over the first `rows` rows of each field in `buffer`; a
        jagged field's JaggedArray of those samples (with ``capacity``: its
        values array is the whole budget, for a worker to write into)."""
        out: list[Any] = []
        for f in self.fields:
            jag = f.jagged
            if jag is None:
                shape = (rows, *f.shape)
                out.append(np.ndarray(shape, f.dtype, buffer=buffer, offset=f.offset))
                continue
            offsets = np.ndarray((rows + 1,), np.int64, buffer=buffer, offset=f.offset)
            total = jag.budget
            if not capacity:
                total = int(offsets[rows])
                if not 0 <= total <= jag.budget or offsets[0] != 0:
                    raise SpecError(
                        f"field {f.name!r}: offsets end at {total}, outside "
                        f"0..{jag.budget}; a fill_batch must write offsets[0] = 0 "
                        "and offsets that never decrease"
                    )
            values = np.ndarray(
                (total, *f.shape), f.dtype, buffer=buffer, offset=jag.values_offset
            )
            out.append(JaggedArray(values, offsets))
        return out

    @staticmethod
    def first_rows(views: Sequence[Any], rows: int) -> list[Any]:
        """Capacity views cut to a batch of `rows` samples."""
        return [
            JaggedArray(v.values, v.offsets[: rows + 1])
            if isinstance(v, JaggedArray)
            else v[:rows]
            for v in views
        ]

    # -------------------------------------------------------------- jagged

    def put_jagged(self, i: int, j: int, value: Any, out: JaggedArray) -> None:
        """Sample j's value of jagged field i, after samples 0..j-1."""
        f = self.fields[i]
        assert f.jagged is not None
        arr = sample_rows(f.name, value, f.dtype, f.shape, f.jagged.max_len)
        offsets = out.offsets
        if j == 0:
            offsets[0] = 0
        start = int(offsets[j])
        end = start + len(arr)
        if end > f.jagged.budget:
            raise over_budget(f.name, end, f.jagged.budget, j + 1)
        out.values[start:end] = arr
        offsets[j + 1] = end

    def put_jagged_batch(self, i: int, value: JaggedArray, out: JaggedArray) -> int:
        """A whole batch's jagged field i (checked) into `out`: its samples."""
        f = self.fields[i]
        assert f.jagged is not None
        n = len(value)
        total = int(value.offsets[-1])
        if total > f.jagged.budget:
            raise over_budget(f.name, total, f.jagged.budget, n)
        out.values[:total] = value.values
        out.offsets[: n + 1] = value.offsets
        return n

    def check_filled(self, views: Sequence[Any]) -> None:
        """After fill_batch: every jagged field's offsets are a batch's."""
        for f, v in zip(self.fields, views):
            if f.jagged is None:
                continue
            lengths = np.diff(v.offsets)
            wrong = (lengths < 0) | (lengths > f.jagged.max_len)
            if v.offsets[0] != 0 or wrong.any() or v.offsets[-1] > f.jagged.budget:
                raise SpecError(
                    f"field {f.name!r}: fill_batch wrote offsets "
                    f"{v.offsets.tolist()[:8]}{'...' if len(v.offsets) > 8 else ''}; "
                    f"expected offsets[0] = 0, each sample 0..max_len="
                    f"{f.jagged.max_len} rows, at most budget={f.jagged.budget} "
                    "in all"
                )

    # --------------------------------------------------------------- checks

    def check_row(self, i: int, value: Any) -> Any:
        """Field i's value for one row, checked against the spec: an array,
        or a scalar numpy may assign as it is."""
        f = self.fields[i]
        if type(value) in self.direct_types[i]:
            return value
        arr = value if type(value) is np.ndarray else as_array(f.name, value)
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
        arr = value if type(value) is np.ndarray else as_array(f.name, value)
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

    def batch_arrays(self, batch: Any) -> tuple[int, list[Any]]:
        """A callable source's batch as (rows, one checked array per field;
        a JaggedArray for a jagged field)."""
        rows: int | None = None
        arrays: list[Any] = []
        for i, leaf in enumerate(self.flatten(batch, "a batch")):
            f = self.fields[i]
            if f.jagged is not None:
                values, offsets = batch_value(
                    f.name, leaf, f.dtype, f.shape, f.jagged.max_len
                )
                jag = JaggedArray(values, offsets)
                rows = _same_count(f.name, len(jag), rows, self.rows)
                arrays.append(jag)
                continue
            arr = self.check_batch(i, leaf)
            rows = same_rows(f.name, arr, rows)
            arrays.append(arr)
        return int(rows or 0), arrays

    def describe(self) -> str:
        return ", ".join(f"{f.name}: {f.describe()}" for f in self.fields)
