"""Variable-length fields: a leading dimension that differs per sample
(audio clips, token sequences, boxes per image), up to a declared bound.

A batch's jagged field lies in its slot as torch's jagged nested tensors
lay one out: the samples' rows back to back (``values``) and where each
sample starts (``offsets``, one more than the batch's samples). The slot
holds ``budget`` rows of values, by default enough for every sample at its
bound; a smaller budget saves memory where most samples are short.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import SpecError


@dataclass(frozen=True)
class Jagged:
    """Declares a variable-length field in ``spec=``.

    Parameters
    ----------
    dtype : numpy dtype
        The values' dtype.
    max_len : int
        The most rows one sample may have (its leading dimension's bound).
    inner : tuple of int
        The shape of each row: () for a sequence of scalars (tokens,
        audio samples), (4,) for boxes.
    budget : int, optional
        The most rows all the samples of one batch may have together; the
        slot is sized for it. Default: batch_size x max_len (never
        exceeded).

    Examples
    --------
    >>> spec = {"audio": fastq.Jagged("float32", max_len=16000),
    ...         "label": ((), "int64")}
    """

    dtype: Any
    max_len: int
    inner: tuple[int, ...] = ()
    budget: int | None = None

    def checked(self, name: str) -> Jagged:
        """This declaration, its values validated; the error names the field."""
        try:
            dtype = np.dtype(self.dtype)
        except TypeError as exc:
            raise SpecError(
                f"spec field {name!r}: Jagged dtype {self.dtype!r} is not a numpy "
                "dtype; give e.g. 'float32' or np.int64"
            ) from exc
        bounds = (
            ("max_len", self.max_len, "one sample"),
            ("budget", self.budget, "a batch"),
        )
        for what, value, of in bounds:
            if value is None and what == "budget":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SpecError(
                    f"spec field {name!r}: Jagged {what}={value!r}; expected an "
                    f"int >= 1 (the most rows {of} may have)"
                )
        inner = tuple(self.inner)
        if not all(isinstance(d, int) and d >= 0 for d in inner):
            raise SpecError(
                f"spec field {name!r}: Jagged inner={self.inner!r}; expected a "
                "tuple of dimensions >= 0, the shape of each row"
            )
        return Jagged(dtype, self.max_len, inner, self.budget)


@dataclass(frozen=True)
class JaggedLayout:
    """A jagged field's place in a slot: offsets, then values."""

    max_len: int
    budget: int  # rows of values the slot holds
    values_offset: int  # bytes from the slot's start


class JaggedArray:
    """One batch's variable-length field: ``values`` (every sample's rows,
    back to back) and ``offsets`` (sample i is ``values[offsets[i]:
    offsets[i + 1]]``), views of the slot like any other field.

    ``len()`` is the batch's samples; indexing and iteration give each
    sample's rows; ``lengths`` their lengths; ``padded()`` the padded
    array most training code wants. ``fastq.torch`` hands it out as
    ``torch.nested.nested_tensor_from_jagged(values, offsets)``, with no
    copy."""

    __slots__ = ("offsets", "values")

    def __init__(self, values: np.ndarray[Any, Any], offsets: np.ndarray[Any, Any]):
        self.values = values
        self.offsets = offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray[Any, Any]:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"sample {i} of a batch of {n}")
        i %= n
        return self.values[self.offsets[i] : self.offsets[i + 1]]

    def __iter__(self) -> Iterator[np.ndarray[Any, Any]]:
        return (self[i] for i in range(len(self)))

    @property
    def lengths(self) -> np.ndarray[Any, Any]:
        return np.diff(self.offsets)

    @property
    def dtype(self) -> np.dtype[Any]:
        dtype: np.dtype[Any] = self.values.dtype
        return dtype

    def padded(
        self, pad_value: Any = 0, length: int | None = None
    ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """(array of shape (samples, length, *inner), lengths): each sample
        padded with ``pad_value`` to ``length`` (default: the longest)."""
        lengths = self.lengths
        longest = int(lengths.max()) if len(lengths) else 0
        if length is None:
            length = longest
        elif length < longest:
            raise ValueError(
                f"length={length}: shorter than the longest sample ({longest} rows)"
            )
        out = np.full(
            (len(self), length, *self.values.shape[1:]), pad_value, self.values.dtype
        )
        # Each value's place: its sample, and its row in that sample.
        samples = np.repeat(np.arange(len(self)), lengths)
        rows = np.arange(len(samples)) - np.repeat(self.offsets[:-1], lengths)
        out[samples, rows] = self.values[self.offsets[0] : self.offsets[-1]]
        return out, lengths

    def copy(self) -> JaggedArray:
        return JaggedArray(self.values.copy(), self.offsets.copy())

    def __repr__(self) -> str:
        return (
            f"JaggedArray({len(self)} samples, lengths {self.lengths.tolist()}, "
            f"dtype {self.values.dtype}, rows of shape {self.values.shape[1:]})"
        )


def _rows_array(
    name: str, value: Any, dtype: np.dtype[Any], inner: tuple[int, ...], what: str
) -> np.ndarray[Any, Any]:
    """`value` as an array of rows of shape `inner`, of a dtype that fits."""
    # As for a fixed field: an array must have the field's dtype; a list
    # of numbers is converted to it.
    arr = value if type(value) is np.ndarray else np.asarray(value, dtype)
    if arr.ndim != 1 + len(inner) or arr.shape[1:] != inner:
        want = ", ".join(["n", *map(str, inner)])
        raise SpecError(
            f"field {name!r} of {what}: expected shape ({want}) (a jagged field: "
            f"n rows of shape {inner}), got shape {arr.shape}"
        )
    if arr.dtype != dtype and arr.dtype.newbyteorder("=") != dtype:
        raise SpecError(
            f"field {name!r} of {what}: dtype {arr.dtype}, but the field's is "
            f"{dtype}; give {dtype} values (or declare the field so)"
        )
    return arr


def sample_rows(
    name: str, value: Any, dtype: np.dtype[Any], inner: tuple[int, ...], max_len: int
) -> np.ndarray[Any, Any]:
    """One sample's value of a jagged field, checked: (n, *inner) rows with
    n <= max_len, of a dtype that fits."""
    arr = _rows_array(name, value, dtype, inner, "a sample")
    if len(arr) > max_len:
        raise SpecError(
            f"field {name!r} of a sample: {len(arr)} rows, over its bound "
            f"max_len={max_len}; raise max_len in fastq.Jagged (the slot grows "
            "with it), or cut the sample"
        )
    return arr


def over_budget(name: str, total: int, budget: int, samples: int) -> SpecError:
    return SpecError(
        f"field {name!r}: {samples} samples of a batch have {total} rows together, "
        f"over its budget={budget}; raise budget= in fastq.Jagged (its default, "
        "batch_size x max_len, is never exceeded), or lower batch_size"
    )


def batch_value(
    name: str,
    value: Any,
    dtype: np.dtype[Any],
    inner: tuple[int, ...],
    max_len: int,
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """A whole batch's value of a jagged field, as (values, offsets): a
    JaggedArray, or a sequence of per-sample arrays."""
    if isinstance(value, JaggedArray):
        offsets = np.asarray(value.offsets, np.int64)
        lengths = np.diff(offsets)
        bad = np.flatnonzero((lengths < 0) | (lengths > max_len))
        if len(offsets) == 0 or len(bad):
            k = int(bad[0]) if len(bad) else 0
            got = int(lengths[k]) if len(lengths) else "no"
            raise SpecError(
                f"field {name!r} of a batch: sample {k} has {got} rows, outside "
                f"0..max_len={max_len}; raise max_len in fastq.Jagged, or cut "
                "the sample"
            )
        values = _rows_array(
            name, value.values[offsets[0] : offsets[-1]], dtype, inner, "a batch"
        )
        return values, offsets - offsets[0]
    if isinstance(value, np.ndarray) or not isinstance(value, Sequence):
        raise SpecError(
            f"field {name!r} of a batch: a jagged field's batch is a "
            f"fastq.JaggedArray or a list of per-sample arrays, got "
            f"{type(value).__name__}"
        )
    samples = [sample_rows(name, v, dtype, inner, max_len) for v in value]
    offsets = np.zeros(len(samples) + 1, np.int64)
    np.cumsum([len(s) for s in samples], out=offsets[1:])
    values = (
        np.concatenate(samples).astype(dtype, copy=False)
        if samples
        else np.empty((0, *inner), dtype)
    )
    return values, offsets


__all__ = [
    "Jagged",
    "JaggedArray",
    "JaggedLayout",
    "batch_value",
    "over_budget",
    "sample_rows",
]
